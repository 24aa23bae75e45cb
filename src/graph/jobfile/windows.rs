//! Event time on sources, and `window` operators.

use super::*;

/// A source's event time and watermarks (`timestamp = "time_ns"` and friends, read by
/// [`WatermarkStrategy::from_section`]): an assigner after the source.
pub(super) fn event_time(d: &mut Decl, stream: Stream<Event>) -> Result<Stream<Event>, JobFileError> {
    match WatermarkStrategy::from_section(&mut d.s)? {
        Some(strategy) => {
            let id = format!("{}.wm", d.id.get_ref());
            Ok(stream.with_event_time(&id, |e: &Event| e.time_ns, strategy))
        }
        None => Ok(stream),
    }
}

/// A side output of a node: its name as readers give it (`<id>.<name>`), and the stream.
pub(super) type SideOutput = (String, Stream<Event>);

/// A `window` operator after a key_by.
/// Returns the window results, whether the window counts in event time, and its side
/// output of late records (`late_output = "<name>"`: the stream `<id>.<name>`), if asked.
pub(super) fn window_node(
    d: &mut Decl,
    keyed: &KeyedStream<Event, u64>,
    id: &str,
    parallelism: u32,
) -> Result<(Stream<WindowResult>, bool, Option<SideOutput>), JobFileError> {
    let s = &mut d.s;
    let shape = s.required::<String>("window", "one of tumbling, sliding, session")?;
    let ms = |s: &mut Section, name: &'static str| -> Result<(Duration, std::ops::Range<usize>), JobFileError> {
        let v = s
            .take::<u64>(name)?
            .ok_or_else(|| s.err(shape.span(), name, format!("a {} window needs `{name}`", shape.get_ref())))?;
        if *v.get_ref() == 0 {
            return Err(s.err(v.span(), name, format!("`{name}` must be at least 1")));
        }
        Ok((Duration::from_millis(*v.get_ref()), v.span()))
    };
    let window = match shape.get_ref().as_str() {
        "tumbling" => Window::tumbling(ms(s, "size_ms")?.0),
        "sliding" => {
            let ((size, _), (slide, at)) = (ms(s, "size_ms")?, ms(s, "slide_ms")?);
            if slide > size {
                return Err(s.err(
                    at,
                    "slide_ms",
                    "the slide is longer than the window; make slide_ms at most size_ms",
                ));
            }
            Window::sliding(size, slide)
        }
        "session" => Window::session(ms(s, "gap_ms")?.0),
        other => {
            let message = format!("unknown window `{other}`; use tumbling, sliding or session");
            return Err(s.err(shape.span(), "window", message));
        }
    };
    let event_time_key = s.take::<bool>("event_time")?;
    let event_time = event_time_key.as_ref().is_none_or(|e| *e.get_ref());
    let window = if event_time { window } else { window.processing_time() };
    if event_time && keyed.event_time().is_none() {
        let span = event_time_key.as_ref().map(|e| e.span()).unwrap_or_else(|| s.kind_span());
        return Err(s.err(
            span,
            "event_time",
            "an event-time window needs event time on its input: set `timestamp = \"time_ns\"` on the source, or `event_time = false` for processing time",
        ));
    }
    let Some(names) = s.take::<Vec<Spanned<String>>>("aggregate")? else {
        return Err(s.err(s.kind_span(), "aggregate", "a window needs `aggregate`, e.g. [\"count\", \"sum\"]"));
    };
    if names.get_ref().is_empty() {
        return Err(s.err(
            names.span(),
            "aggregate",
            "aggregate nothing? list at least one of count, sum, min, max, mean",
        ));
    }
    let value_key = s.take::<String>("value")?;
    let value: fn(&Event) -> u64 = match value_key.as_ref().map(|v| v.get_ref().as_str()) {
        None | Some("value") => |e| e.value,
        Some("seq") => |e| e.seq,
        Some("key") => |e| e.key,
        Some(other) => {
            let span = value_key.as_ref().map(|v| v.span()).expect("matched Some");
            return Err(s.err(span, "value", format!("unknown field `{other}`; aggregate value, seq or key")));
        }
    };
    let mut aggregates = Aggregates::of(value);
    for name in names.get_ref() {
        match Aggregate::from_name(name.get_ref()) {
            Some(a) => aggregates = aggregates.with(a),
            None => {
                let message = format!("unknown aggregate `{}`; use count, sum, min, max or mean", name.get_ref());
                return Err(s.err(name.span(), "aggregate", message));
            }
        }
    }
    let lateness = s.take::<u64>("allowed_lateness_ms")?.map_or(0, Spanned::into_inner);
    let mut windowed = keyed.window(window).allowed_lateness(Duration::from_millis(lateness));
    if let Some(mb) = s.take::<u64>("cache_mb")? {
        let bytes = mb.get_ref().saturating_mul(1024 * 1024);
        if bytes < crate::window::MIN_CACHE_BYTES {
            return Err(s.err(mb.span(), "cache_mb", "cache_mb must be at least 1"));
        }
        windowed = windowed.cache_bytes(bytes);
    }
    match s.take::<String>("late_output")? {
        None => Ok((windowed.aggregate(id, parallelism, aggregates), event_time, None)),
        Some(name) => {
            let n = side_output_name(s, &name, "late_output")?;
            let (results, late) = windowed.aggregate_with_late(id, parallelism, aggregates);
            Ok((results, event_time, Some((format!("{id}.{n}"), late))))
        }
    }
}

/// A side output's name, checked: letters, digits, `_` or `-` (readers name it
/// `<id>.<name>`).
pub(super) fn side_output_name<'a>(
    s: &Section,
    name: &'a Spanned<String>,
    key: &'static str,
) -> Result<&'a str, JobFileError> {
    let n = name.get_ref();
    if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(s.err(
            name.span(),
            key,
            "name the side output with letters, digits, `_` or `-` (readers take it as `<id>.<name>`)",
        ));
    }
    Ok(n)
}
