//! Operator tools for weir.
