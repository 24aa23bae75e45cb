//! Joins in job files: `interval_join` and `window_join` operators over two event streams
//! with event time, keyed by a field of each, emitting [`JoinedEvents`].
//!
//! ```toml
//! [[operator]]
//! id = "matched"
//! type = "interval_join"          # or window_join
//! inputs = ["clicks", "views"]    # left, right: streams with event time (timestamp = "time_ns")
//! left_key = "key"                # key | value | seq | time_ns
//! right_key = "key"
//! lower_ms = -5                   # interval_join: right.time − left.time in [lower_ms, upper_ms]
//! upper_ms = 0
//! join = "inner"                  # inner | left_outer
//! # window_join: window = "tumbling" (size_ms) | "sliding" (size_ms, slide_ms)
//! ```

use super::*;
use crate::operators::join::{Interval, JoinKind};
use crate::record::JoinedEvents;
use crate::util::section::{Affects, Key, KeyType as T, REQUIRED};

/// The keys of a join operator.
pub(super) const JOIN_KEYS: &[Key] = &[
    Key::new("left_key", T::String, REQUIRED, "The left input's key: an event field, `key`, `value`, `seq` or `time_ns`.").affects(Affects::Results),
    Key::new("right_key", T::String, REQUIRED, "The right input's key, as `left_key`.").affects(Affects::Results),
    Key::new("lower_ms", T::Integer, "required by interval_join", "A right record pairs with a left one when its event time is within [left + lower_ms, left + upper_ms] (may be negative).")
        .affects(Affects::Results),
    Key::new("upper_ms", T::Integer, "required by interval_join", "The interval's upper bound, at least `lower_ms`.").affects(Affects::Results),
    Key::new("join", T::String, "inner", "`inner`, or `left_outer`: a left record that met none comes out once, alone, when the watermark closes its interval or window.")
        .affects(Affects::Results),
    Key::new("window", T::String, "required by window_join", "window_join: `tumbling` (`size_ms`) or `sliding` (`size_ms`, `slide_ms`); records of a key pair within a window.")
        .affects(Affects::Results),
    Key::new("size_ms", T::Integer, "required by window_join", "The window's length.").affects(Affects::Results),
    Key::new("slide_ms", T::Integer, "required by a sliding window", "How far apart sliding windows start.").affects(Affects::Results),
];

/// An event's field, by name, as a join's key.
fn field(d: &mut Decl, side: &'static str) -> Result<fn(&Event) -> u64, JobFileError> {
    let name = d.s.required::<String>(side, "one of key, value, seq, time_ns")?;
    Ok(match name.get_ref().as_str() {
        "key" => |e: &Event| e.key,
        "value" => |e: &Event| e.value,
        "seq" => |e: &Event| e.seq,
        "time_ns" => |e: &Event| e.time_ns,
        other => {
            return Err(d.s.err(
                name.span(),
                side,
                format!("unknown field `{other}`; events have key, value, seq, time_ns (all u64)"),
            ));
        }
    })
}

/// Build a join node: its two plain inputs, with event time, into [`JoinedEvents`].
pub(super) fn join_node(
    loc: &Loc,
    d: &mut Decl,
    built: &HashMap<String, Built>,
    id: &str,
    parallelism: u32,
) -> Result<Stream<JoinedEvents>, JobFileError> {
    let kind = d.kind().to_owned();
    let inputs = d.inputs().to_vec();
    if inputs.len() != 2 {
        let at = inputs.get(2).or(inputs.first()).map(|i| i.span());
        return Err(loc.err(
            at,
            d.field("inputs"),
            format!(
                "a {kind} takes two inputs, left and right: inputs = [\"left\", \"right\"] (it has {})",
                inputs.len()
            ),
        ));
    }
    let mut sides = Vec::new();
    for input in &inputs {
        match &built[input.get_ref().as_str()] {
            Built::Plain(s) if s.event_time().is_some() => sides.push(s.clone()),
            Built::Plain(_) => {
                return Err(loc.err(
                    Some(input.span()),
                    d.field("inputs"),
                    format!(
                        "`{}` has no event time, and a {kind} joins on it: give its source `timestamp = \"time_ns\"`",
                        input.get_ref()
                    ),
                ));
            }
            _ => {
                return Err(loc.err(
                    Some(input.span()),
                    d.field("inputs"),
                    format!("`{}` is keyed or emits window results; a {kind} takes event streams and keys them itself (left_key, right_key)", input.get_ref()),
                ));
            }
        }
    }
    let (key_a, key_b) = (field(d, "left_key")?, field(d, "right_key")?);
    let join_kind = match d.s.take::<String>("join")? {
        None => JoinKind::Inner,
        Some(j) => match j.get_ref().as_str() {
            "inner" => JoinKind::Inner,
            "left_outer" => JoinKind::LeftOuter,
            other => return Err(d.s.err(j.span(), "join", format!("unknown join `{other}`; use inner or left_outer"))),
        },
    };
    let keyed = sides[0].connect(&sides[1]).key_by(&format!("{id}-k"), key_a, key_b);
    if kind == "interval_join" {
        let ms = |d: &mut Decl, name: &'static str| -> Result<i64, JobFileError> {
            let v = d.s.required::<i64>(name, "ms of event time, may be negative")?;
            v.get_ref().checked_mul(1_000_000).ok_or_else(|| d.s.err(v.span(), name, "out of range"))
        };
        let (lower, upper) = (ms(d, "lower_ms")?, ms(d, "upper_ms")?);
        if lower > upper {
            let at = d.s.span_of("lower_ms").unwrap_or_else(|| d.s.kind_span());
            return Err(d.s.err(
                at,
                "lower_ms",
                "lower_ms is above upper_ms: no pair can meet; give lower_ms ≤ upper_ms",
            ));
        }
        let interval = Interval { lower, upper, kind: join_kind, ttl: None };
        return Ok(keyed.interval_join(id, parallelism, interval, JoinedEvents::new));
    }
    let window = window_of(d)?;
    Ok(keyed.window_join(id, parallelism, window, join_kind, JoinedEvents::new))
}

/// A window join's windows: tumbling or sliding.
fn window_of(d: &mut Decl) -> Result<Window, JobFileError> {
    let s = &mut d.s;
    let shape = s.required::<String>("window", "one of tumbling, sliding")?;
    let mut ms = |name: &'static str| -> Result<Spanned<u64>, JobFileError> {
        let v = s
            .take::<u64>(name)?
            .ok_or_else(|| s.err(shape.span(), name, format!("a {} window needs `{name}`", shape.get_ref())))?;
        if *v.get_ref() == 0 {
            return Err(s.err(v.span(), name, format!("`{name}` must be at least 1")));
        }
        Ok(v)
    };
    match shape.get_ref().as_str() {
        "tumbling" => Ok(Window::tumbling(Duration::from_millis(*ms("size_ms")?.get_ref()))),
        "sliding" => {
            let (size, slide) = (ms("size_ms")?, ms("slide_ms")?);
            if slide.get_ref() > size.get_ref() {
                return Err(s.err(
                    slide.span(),
                    "slide_ms",
                    "the slide is longer than the window; make slide_ms at most size_ms",
                ));
            }
            Ok(Window::sliding(Duration::from_millis(*size.get_ref()), Duration::from_millis(*slide.get_ref())))
        }
        other => Err(s.err(
            shape.span(),
            "window",
            format!("unknown window `{other}`; a window join takes tumbling or sliding"),
        )),
    }
}
