//! The node catalogue: each `[[source]]`, `[[operator]]` and `[[sink]]` type, built into the
//! job (connectors in `connectors.rs`, windows and event time in `windows.rs`).

use super::*;

/// What building nodes adds besides the streams: `count` sinks' tallies, side outputs, and
/// bounded sources (see [`LoadedJob`]).
pub(super) struct Outputs<'a> {
    pub tallies: &'a mut Vec<(String, Arc<Tally>)>,
    pub sides: &'a mut Vec<(String, Built)>,
    pub bounded: &'a mut Vec<(String, Option<u64>)>,
    #[cfg(feature = "kafka")]
    pub kafka_sources: &'a mut Vec<(String, crate::io::kafka::KafkaSourceConfig)>,
}

pub(super) fn build_node(
    loc: &Loc,
    job: &Job,
    d: &mut Decl,
    built: &HashMap<String, Built>,
    out: &mut Outputs<'_>,
) -> Result<Option<Built>, JobFileError> {
    #[cfg(feature = "kafka")]
    let Outputs { tallies, sides, bounded, kafka_sources } = out;
    #[cfg(not(feature = "kafka"))]
    let Outputs { tallies, sides, bounded } = out;
    let id = d.id.get_ref().clone();
    let id = id.as_str();
    let kind = d.kind().to_owned();
    let kind = kind.as_str();
    let parallelism = d.parallelism.as_ref().map(|p| *p.get_ref());
    let cpus = d.cpus.clone();

    if d.section == "source" {
        let stream = match kind {
            "generator" => {
                let count = d.s.take::<u64>("count")?.map(Spanned::into_inner);
                let keys = d.s.take::<u64>("keys")?.map_or(1000, Spanned::into_inner);
                let rate = d.s.take::<f64>("rate")?;
                if let Some(r) = &rate
                    && !(*r.get_ref() > 0.0 && r.get_ref().is_finite())
                {
                    return Err(d.s.err(
                        r.span(),
                        "rate",
                        "rate must be a positive number of records per second per subtask",
                    ));
                }
                let rate = rate.map(Spanned::into_inner);
                let jitter_ns = d.s.take::<u64>("jitter_us")?.map_or(0, Spanned::into_inner).saturating_mul(1000);
                if let Some(c) = count {
                    bounded.push((id.to_owned(), Some(c)));
                }
                job.source(id, parallelism.unwrap_or(1), move |info| {
                    let g = match count {
                        Some(c) => Generator::events(info, c, keys),
                        None => Generator::events(info, u64::MAX, keys),
                    };
                    let g = if jitter_ns > 0 { g.with_time_jitter(jitter_ns) } else { g };
                    match rate {
                        Some(r) => g.with_rate(r),
                        None => g,
                    }
                })
            }
            "silent" => job.source(id, parallelism.unwrap_or(1), |_| Silent),
            #[cfg(feature = "nexmark")]
            "nexmark" => {
                let (config, projection) = crate::io::nexmark::NexmarkConfig::from_section(&mut d.s)?;
                if let Some(n) = projection.expected_records(&config) {
                    bounded.push((id.to_owned(), Some(n)));
                }
                let make: crate::io::nexmark::Projection<Event> =
                    Arc::new(move |offset: u64, e: crate::io::nexmark::NexmarkEvent| projection.project(offset, &e));
                job.source(id, parallelism.unwrap_or(1), move |info| {
                    crate::io::nexmark::NexmarkSource::with_projection(&config, info, make.clone())
                })
            }
            "ipc" => {
                let config = crate::io::ipc::IpcConfig::from_section(&mut d.s)?;
                let stats = Arc::new(crate::io::ipc::IpcStats::default());
                let p = parallelism.unwrap_or(1);
                let ring = config.ring.region_bytes();
                let gauge = stats.lag_gauge(id);
                let endpoint = stats.endpoint_gauge(id, config.endpoint.as_deref().unwrap_or(id));
                job.configure(|c| {
                    c.lag_gauges.push(gauge);
                    c.endpoint_gauges.push(endpoint);
                    c.connector_memory.push((
                        format!("ipc source {id} endpoints ({p} x {})", crate::telemetry::bytes(ring)),
                        p as u64 * ring,
                    ))
                });
                job.source(id, p, move |info| {
                    crate::io::ipc::IpcSource::<Event>::with_stats(config.clone(), info, stats.clone())
                })
            }
            #[cfg(feature = "kafka")]
            "kafka" => {
                let config = crate::io::kafka::KafkaSourceConfig::from_section(
                    &mut d.s,
                    job.config().max_record_bytes as usize,
                )?;
                let p = parallelism.unwrap_or(1);
                if config.bounded {
                    bounded.push((id.to_owned(), None));
                }
                kafka_sources.push((id.to_owned(), config.clone()));
                let format = crate::io::registry::SourceFormat::from_section(&mut d.s)?;
                let prefetch = config.prefetch_budget_bytes();
                let gauge = config.lag_gauge(id);
                job.configure(|c| {
                    c.lag_gauges.push(gauge);
                    c.connector_memory.push((
                        format!("kafka source {id} prefetch ({p} x {})", crate::telemetry::bytes(prefetch)),
                        p as u64 * prefetch,
                    ))
                });
                // Event time on a Kafka source: watermarks per partition, from the source.
                let strategy = WatermarkStrategy::from_section(&mut d.s)?;
                let stream = job.source(id, p, move |info| {
                    let source = crate::io::kafka::KafkaSource::new(config.clone(), info, format.decoder::<Event>());
                    match strategy {
                        Some(s) => source.with_event_time(|e: &Event| e.time_ns, s),
                        None => source,
                    }
                });
                let stream = with_cpus(stream, &cpus);
                return Ok(Some(Built::Plain(match strategy {
                    Some(_) => stream.with_source_watermarks(|e: &Event| e.time_ns),
                    None => stream,
                })));
            }
            other => unreachable!("`{other}` is not in the catalogue's sources"),
        };
        let stream = event_time(d, with_cpus(stream, &cpus))?;
        return Ok(Some(Built::Plain(stream)));
    }

    if kind == "interval_join" || kind == "window_join" {
        let out = join_node(loc, d, built, id, parallelism.unwrap_or(1))?;
        return Ok(Some(Built::Joined(with_cpus(out, &cpus))));
    }
    // What a join matched goes to a sink, alone.
    if let Some(joined) = d.inputs().iter().find(|i| matches!(built[i.get_ref().as_str()], Built::Joined(_))) {
        let Built::Joined(stream) = &built[joined.get_ref().as_str()] else { unreachable!("matched") };
        if d.section != "sink" || d.inputs().len() > 1 {
            return Err(loc.err(
                Some(joined.span()),
                d.field("input"),
                format!("`{}` emits joined pairs; feed them into a sink, alone", joined.get_ref()),
            ));
        }
        sink_node(job, d, parallelism, tallies, None, |i, p, s| stream.sink(i, p, move |info| s(info)))?;
        return Ok(None);
    }
    // The input: one stream, or a union of plain streams.
    let inputs = d.inputs();
    let keyed_input = inputs.iter().any(|i| matches!(built[i.get_ref().as_str()], Built::Keyed(_)));
    if let Some(results) = inputs.iter().find(|i| matches!(built[i.get_ref().as_str()], Built::Results(..))) {
        let Built::Results(stream, event_time) = &built[results.get_ref().as_str()] else { unreachable!("matched") };
        if d.section != "sink" || inputs.len() > 1 {
            return Err(loc.err(
                Some(results.span()),
                d.field("input"),
                format!("`{}` emits window results; feed them into a sink, alone", results.get_ref()),
            ));
        }
        // Event-time window results name HTTP batches by window and key (idempotency by
        // content: a replay makes the same results). Processing-time ones keep keys by
        // position: no watermark would release them, and a replay counts differently anyway.
        let keys: Option<crate::io::RecordKeyFn<WindowResult>> =
            event_time.then(|| Arc::new(crate::io::window_result_key) as crate::io::RecordKeyFn<WindowResult>);
        sink_node(job, d, parallelism, tallies, keys, |i, p, s| stream.sink(i, p, move |info| s(info)))?;
        return Ok(None);
    }
    let keyed_ops = ["sum_per_key", "window"];
    if keyed_ops.contains(&kind) && !keyed_input {
        return Err(loc.err(
            Some(inputs[0].span()),
            d.field("input"),
            format!("`{id}` is keyed (type {kind}), but its input `{}` is not partitioned by key; put a key_by node between them", inputs[0].get_ref()),
        ));
    }
    if keyed_input && inputs.len() > 1 {
        return Err(loc.err(
            Some(inputs[1].span()),
            d.field("inputs"),
            "a keyed input cannot be unioned with others; key_by after the union instead",
        ));
    }
    if keyed_input {
        let Built::Keyed(keyed) = &built[inputs[0].get_ref().as_str()] else { unreachable!("checked above") };
        let out = match kind {
            "sum_per_key" => keyed.process(id, parallelism.unwrap_or(1), |_| SumPerKey::default()),
            "window" => {
                let (out, event_time, late) = window_node(d, keyed, id, parallelism.unwrap_or(1))?;
                if let Some((name, late)) = late {
                    sides.push((name, Built::Plain(late)));
                }
                return Ok(Some(Built::Results(with_cpus(out, &cpus), event_time)));
            }
            "map" | "filter" | "flat_map" => {
                return Err(d.s.err(d.s.kind_span(), "type", "after a key_by, use a keyed operator (sum_per_key, window) or a sink; stateless operators go before the key_by"));
            }
            _ if d.section == "sink" => {
                sink_node(job, d, parallelism, tallies, None, |i, p, s| keyed.sink(i, p, move |info| s(info)))?;
                return Ok(None);
            }
            _ => {
                return Err(d.s.err(d.s.kind_span(), "type", "after a key_by, use sum_per_key, window, or a sink"));
            }
        };
        return Ok(Some(Built::Plain(with_cpus(out, &cpus))));
    }
    let mut stream = match &built[inputs[0].get_ref().as_str()] {
        Built::Plain(s) => s.clone(),
        Built::Keyed(_) | Built::Results(..) | Built::Joined(_) => {
            unreachable!("keyed inputs, results and joined pairs handled above")
        }
    };
    for more in &inputs[1..] {
        if let Built::Plain(s) = &built[more.get_ref().as_str()] {
            stream = stream.union(s);
        }
    }
    if let Some(p) = &d.partitioning {
        stream = match p.get_ref().as_str() {
            "forward" => stream.forward(),
            "rebalance" => stream.rebalance(),
            "broadcast" => stream.broadcast(),
            other => {
                return Err(loc.err(
                    Some(p.span()),
                    d.field("partitioning"),
                    format!(
                        "unknown partitioning `{other}`; use forward, rebalance or broadcast (hash: add a key_by node)"
                    ),
                ));
            }
        };
    }

    if d.section == "sink" {
        sink_node(job, d, parallelism, tallies, None, |i, p, s| stream.sink(i, p, move |info| s(info)))?;
        return Ok(None);
    }
    let out = match kind {
        "key_by" => {
            let field = d.s.required::<String>("field", "one of key, value, seq")?;
            let key: fn(&Event) -> u64 = match field.get_ref().as_str() {
                "key" => |e: &Event| e.key,
                "value" => |e: &Event| e.value,
                "seq" => |e: &Event| e.seq,
                other => {
                    return Err(d.s.err(
                        field.span(),
                        "field",
                        format!("unknown field `{other}`; events have key, value, seq"),
                    ));
                }
            };
            #[cfg(feature = "kafka")]
            let stream = {
                let config = job.config();
                let checkpoints = config.checkpoints.as_ref().map(|k| (k.dir.as_path(), k.timeout));
                let through = crate::io::kafka::RepartitionTopic::from_section(
                    &mut d.s,
                    &config.name,
                    id,
                    checkpoints,
                    config.max_record_bytes as usize,
                )?;
                match through {
                    Some(topic) => repartition(job, id, &stream, key, parallelism, topic),
                    None => stream,
                }
            };
            #[cfg(not(feature = "kafka"))]
            if let Some((key, span)) =
                catalogue::REPARTITION_KEYS.iter().find_map(|k| Some((k.name, d.s.span_of(k.name)?)))
            {
                return Err(d.s.err(span, key, catalogue::not_built("a key_by through a repartition topic", "kafka")));
            }
            return Ok(Some(Built::Keyed(stream.key_by(id, key))));
        }
        "map" => {
            let f = d.s.required::<String>("function", "one of identity, double_value, key_mod")?;
            match f.get_ref().as_str() {
                "identity" => stream.map(id, |e: &Event| *e),
                "double_value" => stream.map(id, |e: &Event| Event { value: e.value * 2, ..*e }),
                "key_mod" => {
                    let m = d.s.take::<u64>("modulus")?.map_or(0, Spanned::into_inner);
                    if m == 0 {
                        return Err(d.s.err(d.s.kind_span(), "modulus", "key_mod needs `modulus` >= 1"));
                    }
                    stream.map(id, move |e: &Event| Event { key: e.key % m, ..*e })
                }
                other => return Err(unknown_function(d, &f, other, "identity, double_value, key_mod")),
            }
        }
        "filter" => {
            let f = d.s.required::<String>("function", "one of key_even, key_multiple_of, value_below")?;
            let keep: Arc<dyn Fn(&Event) -> bool + Send + Sync> = match f.get_ref().as_str() {
                "key_even" => Arc::new(|e: &Event| e.key.is_multiple_of(2)),
                // Nexmark's q2: bids on every 123rd auction (`modulus = 123`).
                "key_multiple_of" => {
                    let m = d.s.take::<u64>("modulus")?.map_or(0, Spanned::into_inner);
                    if m == 0 {
                        return Err(d.s.err(d.s.kind_span(), "modulus", "key_multiple_of needs `modulus` >= 1"));
                    }
                    Arc::new(move |e: &Event| e.key.is_multiple_of(m))
                }
                "value_below" => {
                    let t = d.s.take::<u64>("threshold")?.map_or(50, Spanned::into_inner);
                    Arc::new(move |e: &Event| e.value < t)
                }
                other => return Err(unknown_function(d, &f, other, "key_even, key_multiple_of, value_below")),
            };
            match d.s.take::<String>("side_output")? {
                None => stream.filter(id, move |e: &Event| keep(e)),
                // What the filter drops, as a stream of its own (`<id>.<name>`): a dead-letter
                // or alert output, routed to a sink like any stream.
                Some(name) => {
                    let n = side_output_name(&d.s, &name, "side_output")?;
                    // Nodes `id` (routing), `<id>-ok` and `<id>-err`, chained together.
                    let routed = stream.map(id, move |e: &Event| {
                        if keep(e) { crate::record::Either::Left(*e) } else { crate::record::Either::Right(*e) }
                    });
                    let routed = match parallelism {
                        Some(p) => routed.parallelism(p),
                        None => routed,
                    };
                    let (kept, dropped) = routed.split(&format!("{id}-ok"), &format!("{id}-err"));
                    sides.push((format!("{id}.{n}"), Built::Plain(with_cpus(dropped, &cpus))));
                    kept
                }
            }
        }
        "flat_map" => {
            let f = d.s.required::<String>("function", "repeat")?;
            match f.get_ref().as_str() {
                "repeat" => {
                    let times = d.s.take::<u64>("times")?;
                    if let Some(t) = &times
                        && !(1..=MAX_REPEAT).contains(t.get_ref())
                    {
                        let message = format!("repeat each record 1 to {MAX_REPEAT} times");
                        return Err(d.s.err(t.span(), "times", message));
                    }
                    let times = times.map_or(2, Spanned::into_inner);
                    stream.flat_map(id, move |e: &Event| std::iter::repeat_n(*e, times as usize))
                }
                other => return Err(unknown_function(d, &f, other, "repeat")),
            }
        }
        "sum_per_key" | "window" => unreachable!("keyed operators were checked above"),
        other => unreachable!("`{other}` is not in the catalogue's operators"),
    };
    let out = match parallelism {
        Some(p) => out.parallelism(p),
        None => out,
    };
    Ok(Some(Built::Plain(with_cpus(out, &cpus))))
}

#[cfg(feature = "kafka")]
/// A key_by's input through its repartition topic (see [`crate::io::kafka::repartition`]):
/// the stream ends in a Kafka sink `<id>-repartition-w` that writes each event to the
/// partition of its key, and goes on from a Kafka source `<id>-repartition-r` of one
/// subtask per partition (`parallelism`, else the upstream's; each instance's partitions
/// when instances share the job), its watermarks from the writers' markers.
fn repartition(
    job: &Job,
    id: &str,
    stream: &Stream<Event>,
    key: fn(&Event) -> u64,
    parallelism: Option<u32>,
    topic: crate::io::kafka::RepartitionTopic,
) -> Stream<Event> {
    use crate::io::kafka::{KafkaSink, KafkaSource, repartition::RepartitionCodec};
    let partitions = parallelism.unwrap_or_else(|| stream.producer_parallelism());
    let key_hash: crate::record::KeyFn<Event> = Arc::new(move |e: &Event| crate::record::hash_key(&key(e)));
    let (sink, source) = (topic.sink, topic.source);
    let writer = format!("{id}-repartition-w");
    let (queue, writers) = (sink.queue_budget_bytes(), u64::from(stream.producer_parallelism()));
    let gauge = sink.sink_gauge(&writer);
    job.configure(|c| {
        c.sink_gauges.push(gauge);
        c.connector_memory.push((
            format!("kafka repartition {id} queues ({writers} x {})", crate::telemetry::bytes(queue)),
            writers * queue,
        ));
    });
    stream.sink(&writer, stream.producer_parallelism(), move |info| {
        // One instance of several: every node has a subtask per partition.
        let p = if info.owned.is_some() { info.parallelism } else { partitions };
        KafkaSink::new(sink.clone(), info, RepartitionCodec::<Event>::default()).with_repartition(
            key_hash.clone(),
            p,
            info,
        )
    });
    let reader = format!("{id}-repartition-r");
    job.configure(|c| c.lag_gauges.push(source.lag_gauge(&reader)));
    let time = stream.event_time();
    let strategy = WatermarkStrategy::bounded(Duration::ZERO);
    let read = job.source(&reader, partitions, move |info| {
        let source = KafkaSource::new(source.clone(), info, RepartitionCodec::<Event>::default());
        match time.clone() {
            Some(t) => source.with_writer_watermarks(move |e: &Event| t(e), strategy),
            None => source.with_writer_watermarks(|e: &Event| e.time_ns, strategy),
        }
    });
    match stream.event_time() {
        Some(t) => read.with_source_watermarks(move |e: &Event| t(e)),
        None => read,
    }
}

/// The most copies `flat_map` `repeat` makes of one record: one record's output is emitted
/// in one go (a subtask cannot be stopped inside it), so it is bounded.
const MAX_REPEAT: u64 = 1_000_000;

pub(super) fn with_cpus<T: Record>(stream: Stream<T>, cpus: &Option<Vec<usize>>) -> Stream<T> {
    match cpus {
        Some(c) => stream.cpus(c),
        None => stream,
    }
}

pub(super) fn unknown_function(d: &Decl, function: &Spanned<String>, name: &str, known: &str) -> JobFileError {
    d.s.err(function.span(), "function", format!("unknown function `{name}`; built-ins here: {known}"))
}

/// A sink factory of any sink type, boxed so every branch below has one type.
pub(super) type SinkMaker<T> = Arc<dyn Fn(&SubtaskInfo) -> Box<dyn Sink<T>> + Send + Sync>;
