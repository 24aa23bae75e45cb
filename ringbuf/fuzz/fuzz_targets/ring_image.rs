//! Arbitrary bytes as a whole ring image (header and slots, as a ring file holds them):
//! validated as attach validates a file, then read as the consumer would, releasing each
//! record. A peer that maps the ring may write any of these bytes; whatever they are, the
//! ring must refuse them or poison itself, never panic, read out of bounds or loop.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|image: &[u8]| {
    let _ = weir_ring::fuzzing::check_image(image);
});
