//! The counters file (issue 3).
