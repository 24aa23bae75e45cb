//! Event time on sources, and `window` operators.

use super::*;

/// A source's event time and watermarks (`timestamp = "time_ns"` and friends): an
/// assigner after the source.
pub(super) fn event_time(loc: &Loc, d: &Decl, stream: Stream<Event>) -> Result<Stream<Event>, JobFileError> {
    match watermark_strategy(loc, d)? {
        Some(strategy) => {
            let id = format!("{}.wm", d.node.id.get_ref());
            Ok(stream.with_event_time(&id, |e: &Event| e.time_ns, strategy))
        }
        None => Ok(stream),
    }
}

/// The watermark strategy of a source declaration, `None` without `timestamp`.
pub(super) fn watermark_strategy(loc: &Loc, d: &Decl) -> Result<Option<WatermarkStrategy>, JobFileError> {
    let n = d.node;
    let Some(field) = &n.timestamp else {
        let stray = [
            ("max_out_of_orderness_ms", n.max_out_of_orderness_ms.is_some()),
            ("watermark_every", n.watermark_every.is_some()),
            ("watermark_interval_ms", n.watermark_interval_ms.is_some()),
        ];
        if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(loc.err(
                Some(n.kind.span()),
                d.field(name),
                format!("`{name}` needs event time: add `timestamp = \"time_ns\"`"),
            ));
        }
        return Ok(None);
    };
    if field.get_ref() != "time_ns" {
        return Err(loc.err(
            Some(field.span()),
            d.field("timestamp"),
            format!("unknown timestamp field `{}`; events carry their event time in `time_ns`", field.get_ref()),
        ));
    }
    let mut strategy = WatermarkStrategy::bounded(Duration::from_millis(n.max_out_of_orderness_ms.unwrap_or(0)));
    if let Some(every) = &n.watermark_every {
        if *every.get_ref() == 0 {
            return Err(loc.err(
                Some(every.span()),
                d.field("watermark_every"),
                "watermark_every must be at least 1 record",
            ));
        }
        strategy = strategy.every_records(Some(*every.get_ref()));
    }
    if let Some(ms) = n.watermark_interval_ms {
        strategy = strategy.interval(Some(Duration::from_millis(ms)));
    }
    Ok(Some(strategy))
}

/// A `window` operator after a key_by.
pub(super) fn window_node(
    loc: &Loc,
    d: &Decl,
    keyed: &KeyedStream<Event, u64>,
    id: &str,
    parallelism: u32,
) -> Result<Stream<WindowResult>, JobFileError> {
    let n = d.node;
    let shape = required(loc, d, &n.window, "window", "one of tumbling, sliding, session")?;
    let ms = |value: &Option<Spanned<u64>>, name: &str| -> Result<Duration, JobFileError> {
        let v = value.as_ref().ok_or_else(|| {
            let span = n.window.as_ref().map(|w| w.span());
            loc.err(span, d.field(name), format!("a {shape} window needs `{name}`"))
        })?;
        if *v.get_ref() == 0 {
            return Err(loc.err(Some(v.span()), d.field(name), format!("`{name}` must be at least 1")));
        }
        Ok(Duration::from_millis(*v.get_ref()))
    };
    let window = match shape.as_str() {
        "tumbling" => Window::tumbling(ms(&n.size_ms, "size_ms")?),
        "sliding" => {
            let (size, slide) = (ms(&n.size_ms, "size_ms")?, ms(&n.slide_ms, "slide_ms")?);
            if slide > size {
                let span = n.slide_ms.as_ref().map(|s| s.span());
                return Err(loc.err(
                    span,
                    d.field("slide_ms"),
                    "the slide is longer than the window; make slide_ms at most size_ms",
                ));
            }
            Window::sliding(size, slide)
        }
        "session" => Window::session(ms(&n.gap_ms, "gap_ms")?),
        other => {
            let span = n.window.as_ref().map(|w| w.span());
            return Err(loc.err(
                span,
                d.field("window"),
                format!("unknown window `{other}`; use tumbling, sliding or session"),
            ));
        }
    };
    let event_time = n.event_time.as_ref().is_none_or(|e| *e.get_ref());
    let window = if event_time { window } else { window.processing_time() };
    if event_time && keyed.event_time().is_none() {
        let span = n.event_time.as_ref().map(|e| e.span()).unwrap_or_else(|| n.kind.span());
        return Err(loc.err(
            Some(span),
            d.field("event_time"),
            "an event-time window needs event time on its input: set `timestamp = \"time_ns\"` on the source, or `event_time = false` for processing time",
        ));
    }
    let Some(names) = &n.aggregate else {
        return Err(loc.err(
            Some(n.kind.span()),
            d.field("aggregate"),
            "a window needs `aggregate`, e.g. [\"count\", \"sum\"]",
        ));
    };
    if names.get_ref().is_empty() {
        return Err(loc.err(
            Some(names.span()),
            d.field("aggregate"),
            "aggregate nothing? list at least one of count, sum, min, max, mean",
        ));
    }
    let value: fn(&Event) -> u64 = match n.value.as_ref().map(|v| v.get_ref().as_str()) {
        None | Some("value") => |e| e.value,
        Some("seq") => |e| e.seq,
        Some("key") => |e| e.key,
        Some(other) => {
            let span = n.value.as_ref().map(|v| v.span());
            return Err(loc.err(
                span,
                d.field("value"),
                format!("unknown field `{other}`; aggregate value, seq or key"),
            ));
        }
    };
    let mut aggregates = Aggregates::of(value);
    for name in names.get_ref() {
        match Aggregate::from_name(name.get_ref()) {
            Some(a) => aggregates = aggregates.with(a),
            None => {
                return Err(loc.err(
                    Some(name.span()),
                    d.field("aggregate"),
                    format!("unknown aggregate `{}`; use count, sum, min, max or mean", name.get_ref()),
                ));
            }
        }
    }
    let mut windowed = keyed.window(window).allowed_lateness(Duration::from_millis(n.allowed_lateness_ms.unwrap_or(0)));
    if let Some(mb) = &n.cache_mb {
        let bytes = mb.get_ref().saturating_mul(1024 * 1024);
        if bytes < crate::window::MIN_CACHE_BYTES {
            return Err(loc.err(Some(mb.span()), d.field("cache_mb"), "cache_mb must be at least 1"));
        }
        windowed = windowed.cache_bytes(bytes);
    }
    Ok(with_cpus(windowed.aggregate(id, parallelism, aggregates), n))
}
