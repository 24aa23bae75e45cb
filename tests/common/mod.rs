//! Code shared by several test files.

pub mod counting;
