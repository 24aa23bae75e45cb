//! The head of a subtask fed by rings: decodes each record in place and hands it to the
//! chain.

use super::{DecoderFn, ErasedInput, unerase};
use crate::operators::{Collector, Halt, OperatorError, Signal, Work};
use crate::record::Record;
use std::sync::Arc;

struct Decoder<T> {
    down: Box<dyn Collector<T>>,
    node: String,
}

impl<T: Record> ErasedInput for Decoder<T> {
    #[inline]
    fn on_bytes(&mut self, bytes: &[u8]) -> Result<(), Halt> {
        let down = &mut self.down;
        match T::decode(bytes, |record| down.collect(record)) {
            Ok(result) => result,
            Err(source) => Err(OperatorError::Decode { node: self.node.clone(), source }.into()),
        }
    }
    #[inline]
    fn on_run(&mut self, run: &[u8], stride: usize) -> Result<(), Halt> {
        let down = &mut self.down;
        if let Some(result) = T::decode_run(run, stride, |records| down.collect_batch(records)) {
            return result;
        }
        if stride == 0 {
            // A run of one empty record.
            return self.on_bytes(run);
        }
        debug_assert!(run.len().is_multiple_of(stride), "a run is whole records");
        for bytes in run.chunks_exact(stride) {
            self.on_bytes(bytes)?;
        }
        Ok(())
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.down.signal(signal)
    }
    fn resume(&mut self) -> Result<Work, Halt> {
        self.down.resume()
    }
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.down.poll_timers()
    }
}

pub(crate) fn decoder_fn<T: Record>() -> DecoderFn {
    Arc::new(|down, node| Box::new(Decoder { down: unerase::<T>(down, node), node: node.to_owned() }))
}
