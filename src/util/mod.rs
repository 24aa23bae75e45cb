//! Small utilities every layer may use: errno texts, durations in messages, the job-file
//! format ([`section`]). The bottom layer, with
//! [`crate::record`]: it imports nothing of the engine.

mod errno;
pub mod section;

pub use errno::{errno_text, io_error_text, path_error};

/// A duration as a person reads it in a message: `250 µs`, `40 ms`, `1.5 s`, `90 s`.
pub fn duration_text(d: std::time::Duration) -> String {
    let us = d.as_micros();
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{} ms", d.as_millis())
    } else if d.as_secs() < 10 && d.subsec_millis().is_multiple_of(100) {
        format!("{:.1} s", d.as_secs_f64())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_for_people() {
        assert_eq!(super::duration_text(Duration::from_micros(250)), "250 µs");
        assert_eq!(super::duration_text(Duration::from_millis(40)), "40 ms");
        assert_eq!(super::duration_text(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(super::duration_text(Duration::from_secs(90)), "90 s");
        assert_eq!(super::duration_text(Duration::from_millis(12_345)), "12.345 s");
    }
}
