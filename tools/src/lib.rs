//! Operator tools for weir. They read shared memory only (the counters file, ring headers),
//! so they work while a job is stuck, and need nothing from it.
//!
//! - `weir-stat`: live counters of a running job (see [`stat`]).
//!
//! And a test peer, which is no operator tool and touches no job:
//!
//! - `weir-slow-api`: a slow REST API on loopback for testing the HTTP sink (see [`slow_api`]);
//!   tests start it in process through the library.

pub mod slow_api;
pub mod stat;
