//! A ring image (as `ring_image` takes it) read by a consumer while a peer writes over the
//! live ring's header after the first read: the first 36 bytes of the input are what it
//! writes (magic, version, sizes, state, poison code), the rest is the image. Whatever it
//! writes, the ring must refuse or poison, never panic, read out of bounds or loop; and a
//! header whose fixed fields changed is never read as an end of stream (`Closed`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_ring::fuzzing::{End, Outcome, check_image_scribbled};

fuzz_target!(|input: &[u8]| {
    let (scribble, image) = input.split_at(input.len().min(36));
    if let Outcome::Read { end, .. } = check_image_scribbled(image, scribble) {
        // The fixed fields (bytes 0..28 of the header, in the scribble's order too) changed.
        let k = scribble.len().min(28).min(image.len());
        if scribble[..k] != image[..k] {
            assert!(matches!(end, End::Failed(_) | End::Bound), "a header written over read as {end:?}");
        }
    }
});
