//! Operator tools for weir. They read shared memory only (the counters file, ring headers),
//! so they work while a job is stuck, and need nothing from it.
//!
//! - `weir-stat`: live counters of a running job (see [`stat`]).

pub mod stat;
