//! Benchmarks for weir.
