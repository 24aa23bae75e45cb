//! Sink nodes: the built-in sinks, and the connectors' (each reads its own section: see
//! `from_section` in `io/`).

use super::*;

pub(super) fn sink_node<T: Record + std::fmt::Display + serde::Serialize>(
    job: &Job,
    d: &mut Decl,
    parallelism: Option<u32>,
    tallies: &mut Vec<(String, Arc<Tally>)>,
    record_keys: Option<crate::io::RecordKeyFn<T>>,
    attach: impl FnOnce(&str, u32, SinkMaker<T>),
) -> Result<(), JobFileError>
where
    CountingSink: Sink<T>,
{
    let id = d.id.get_ref().clone();
    let id = id.as_str();
    let kind = d.kind().to_owned();
    let maker: SinkMaker<T> = match kind.as_str() {
        "count" => {
            let delay = d.s.take::<u64>("delay_us")?.map(|d| Duration::from_micros(d.into_inner()));
            let tally = Arc::new(Tally::default());
            tallies.push((id.to_owned(), tally.clone()));
            Arc::new(move |_| {
                let s = CountingSink::new(tally.clone());
                Box::new(match delay {
                    Some(d) => s.with_delay(d),
                    None => s,
                })
            })
        }
        "null" => Arc::new(|_| Box::new(NullSink)),
        "stdout" => Arc::new(|_| Box::new(StdoutSink)),
        "file" => {
            let config = FileSinkConfig::from_section(&mut d.s)?;
            Arc::new(move |info| Box::new(FileSink::new(config.clone(), info)))
        }
        "tcp" => {
            let config = TcpSinkConfig::from_section(&mut d.s)?;
            Arc::new(move |info| Box::new(TcpSink::new(config.clone(), info)))
        }
        "http" => {
            let config = HttpSinkConfig::from_section(&mut d.s, &job.config().name)?;
            let gauge = config.sink_gauge(id);
            let p = parallelism.unwrap_or(1) as u64;
            let held = config.budget_bytes();
            job.configure(|c| {
                c.sink_gauges.push(gauge);
                c.connector_memory.push((
                    format!("http sink {id} held and pending ({p} x {})", crate::telemetry::bytes(held)),
                    p * held,
                ))
            });
            Arc::new(move |info| {
                let sink = HttpSink::new(config.clone(), info);
                Box::new(match record_keys.clone() {
                    Some(keys) => sink.with_record_keys(move |r: &T, identity: &mut String| keys(r, identity)),
                    None => sink,
                })
            })
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            let config = crate::io::postgres::PostgresSinkConfig::from_section(&mut d.s, &job.config().name)?;
            if config.delivery == crate::io::postgres::Delivery::ExactlyOnce && job.config().checkpoints.is_none() {
                let span = d.s.span_of("delivery").or_else(|| d.s.span_of("connection")).unwrap_or(0..0);
                return Err(d.s.err(
                    span,
                    "delivery",
                    "exactly_once commits what a checkpoint prepared when it completes, and this job takes no \
                     checkpoints: give [job] a checkpoint_dir, or use delivery = \"upsert\" or \"at_least_once\"",
                ));
            }
            let gauge = config.sink_gauge(id);
            let p = parallelism.unwrap_or(1) as u64;
            let each = config.memory_bytes();
            job.configure(|c| {
                c.sink_gauges.push(gauge);
                c.connector_memory
                    .push((format!("postgres sink {id} batches ({p} x {})", crate::telemetry::bytes(each)), p * each))
            });
            Arc::new(move |info| Box::new(crate::io::postgres::PostgresSink::<T>::new(config.clone(), info)))
        }
        #[cfg(feature = "kafka")]
        "kafka" => {
            let checkpoints = job.config().checkpoints.as_ref().map(|k| (k.dir.clone(), k.timeout));
            let checkpoints = checkpoints.as_ref().map(|(dir, timeout)| (dir.as_path(), *timeout));
            let config = crate::io::kafka::KafkaSinkConfig::from_section(&mut d.s, checkpoints)?;
            let format = crate::io::registry::SinkFormat::from_section(&mut d.s, &config.topic)?;
            let gauge = config.sink_gauge(id);
            job.configure(|c| c.sink_gauges.push(gauge));
            let p = parallelism.unwrap_or(1) as u64;
            // Per subtask, all its producers (one, or the transactional pool).
            let queue = config.queue_budget_bytes();
            job.configure(|c| {
                c.connector_memory
                    .push((format!("kafka sink {id} queues ({p} x {})", crate::telemetry::bytes(queue)), p * queue))
            });
            Arc::new(move |info| {
                Box::new(crate::io::kafka::KafkaSink::new(config.clone(), info, format.encoder::<T>()))
            })
        }
        "ipc" => {
            let config = crate::io::ipc::IpcConfig::from_section(&mut d.s)?;
            let stats = Arc::new(crate::io::ipc::IpcStats::default());
            let p = parallelism.unwrap_or(1) as u64;
            let ring = config.ring.region_bytes();
            let gauge = stats.sink_gauge(id);
            job.configure(|c| {
                c.sink_gauges.push(gauge);
                c.connector_memory
                    .push((format!("ipc sink {id} endpoints ({p} x {})", crate::telemetry::bytes(ring)), p * ring))
            });
            Arc::new(move |info| {
                Box::new(crate::io::ipc::IpcSink::<T>::with_stats(config.clone(), info, stats.clone()))
            })
        }
        other => unreachable!("`{other}` is not in the catalogue's sinks"),
    };
    attach(id, parallelism.unwrap_or(1), maker);
    Ok(())
}

/// Prints each record on a line.
pub(super) struct StdoutSink;

impl<T: std::fmt::Display> Sink<T> for StdoutSink {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        use std::io::Write;
        writeln!(std::io::stdout().lock(), "{record}").map_err(|e| Halt::failed(format!("stdout: {e}")))
    }
}
