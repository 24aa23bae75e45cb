//! Arbitrary bytes as a whole ring image (header and slots, as a ring file holds them):
//! validated as attach validates a file, then read as the consumer would, releasing each
//! record. A peer that maps the ring may write any of these bytes; whatever they are, the
//! ring must refuse them or poison itself, never panic, read out of bounds or loop.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|image: &[u8]| {
    let one_by_one = weir_ring::fuzzing::check_image(image);
    // Read again as runs (a fixed frame's records at once): the same records, the same end.
    let runs = weir_ring::fuzzing::check_image_runs(image);
    assert_eq!(format!("{one_by_one:?}"), format!("{runs:?}"), "read_runs differs from read");
});
