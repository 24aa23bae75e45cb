//! # weir: a zero-copy streaming dataplane for one multicore host
//!
//! The engine crate. The ring it is built on is `weir-ring` (in `ringbuf/`).

#![deny(unsafe_code)]

pub use weir_ring as ring;
