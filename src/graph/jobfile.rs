//! Job files (TOML): placeholder, filled in below.
