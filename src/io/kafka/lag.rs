//! Lag that stays true while a source is paused. A source publishes its partitions' lag from
//! librdkafka's cached high watermarks, and only between polls: when the job backpressures
//! it, it neither polls nor publishes, and the cache moves only with fetches — so the lag
//! that matters most (records piling up in Kafka while the job is slow) moved in steps of
//! seconds. A refresher, one thread per source subtask, asks the brokers for the owned
//! partitions' high watermarks every `lag_refresh` (a ListOffsets request on a client of its
//! own, off the record path) and publishes `high − position` with the position the source
//! last published; positions only move while the source runs, which is when it publishes
//! itself. Both writers keep the larger high watermark, so the lag never steps back to a
//! stale cache.

use super::KafkaSourceConfig;
use super::reach;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// Stops its thread when dropped (the thread ends after the query in flight, if any).
#[derive(Debug)]
pub(crate) struct LagRefresher {
    _stop: mpsc::Sender<()>,
}

impl LagRefresher {
    /// Refresh the lag of `owned` partitions of `config`'s topic every `every`. `None` (the
    /// lag then moves with the source's own publishing, as before) when the client or the
    /// thread cannot be made; the source is not failed for its telemetry.
    pub(crate) fn start(
        config: &KafkaSourceConfig,
        owned: Vec<i32>,
        every: Duration,
        name: &str,
    ) -> Option<LagRefresher> {
        let mut c = ClientConfig::new();
        for (k, v) in reach::connection_properties(&config.properties) {
            c.set(k, v);
        }
        let client: BaseConsumer = match c.create() {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!(source = name, "no lag refresher: {e}");
                return None;
            }
        };
        let (stop, stopped) = mpsc::channel::<()>();
        let stats = config.stats.clone();
        let topic = config.topic.clone();
        let timeout = config.request_timeout.min(every.max(Duration::from_secs(1)));
        std::thread::Builder::new()
            .name(format!("weir-lag-{name}"))
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    for &p in &owned {
                        let Some(s) = stats.partition(p) else { continue };
                        let position = s.position.load(Ordering::Relaxed);
                        if position < 0 {
                            continue;
                        }
                        if let Ok((_, high)) = client.fetch_watermarks(&topic, p, timeout) {
                            let high = s.high_watermark.fetch_max(high, Ordering::Relaxed).max(high);
                            s.lag.store((high - position).max(0), Ordering::Relaxed);
                        }
                    }
                }
            })
            .ok()?;
        Some(LagRefresher { _stop: stop })
    }
}
