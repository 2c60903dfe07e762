//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): a `traceparent` read as the
//! remote parent of a request's span, and a span's context written as one for whoever is
//! called next (a tool server, in `_meta`).

use std::str::FromStr;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The longest `tracestate` taken (the spec's limit: 32 entries of at most 256 characters
/// would be more; vendors cut at 512).
const MAX_TRACESTATE: usize = 512;

/// `traceparent` (and `tracestate`) as a remote parent. `None` when it is not one the spec
/// accepts: a new trace starts then, and the `tracestate` goes with the rest.
pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let t = traceparent.trim_matches([' ', '\t']);
    let b = t.as_bytes();
    // version "-" trace-id "-" parent-id "-" flags: 2, 32, 16 and 2 lower-case hex digits.
    if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let (version, trace, parent, flags) = (&t[..2], &t[3..35], &t[36..52], &t[53..55]);
    if ![version, trace, parent, flags]
        .iter()
        .all(|f| is_lower_hex(f))
        || version == "ff"
    {
        return None;
    }
    // Version 00 is exactly this long; a later version may add fields after a dash.
    if (version == "00" && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(parent).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    // Only the sampled bit is ours to act on and pass on.
    let flags = TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8());
    let state = tracestate
        .filter(|s| s.len() <= MAX_TRACESTATE)
        .and_then(|s| TraceState::from_str(s.trim_matches([' ', '\t'])).ok())
        .unwrap_or_default();
    Some(SpanContext::new(trace_id, span_id, flags, true, state))
}

fn is_lower_hex(field: &str) -> bool {
    field
        .bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// The `traceparent` and (when not empty) `tracestate` that make `span` the parent of
/// whatever receives them.
pub fn format(span: &SpanContext) -> (String, Option<String>) {
    let traceparent = format!(
        "00-{}-{}-{:02x}",
        span.trace_id(),
        span.span_id(),
        span.trace_flags().to_u8()
    );
    let state = span.trace_state().header();
    (traceparent, (!state.is_empty()).then_some(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_the_remote_parent() {
        let cx = parse(GOOD, None).unwrap();
        assert_eq!(
            cx.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(cx.span_id().to_string(), "00f067aa0ba902b7");
        assert!(cx.is_sampled() && cx.is_remote());
        let unsampled = parse(&GOOD.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.is_sampled());
        // Surrounding blanks (the header's optional white space) do not matter.
        assert!(parse(&format!(" \t{GOOD} "), None).is_some());
    }

    #[test]
    fn a_malformed_traceparent_is_no_parent() {
        for bad in [
            "",
            "00",
            // Upper-case hex, a wrong length, a missing or extra dash.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "004bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // All-zero ids, version ff, not hex.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // Version 00 has nothing after its flags.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
        ] {
            assert!(parse(bad, Some("a=b")).is_none(), "{bad:?} was taken");
        }
    }

    #[test]
    fn a_later_version_may_add_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(parse(later, None).is_some());
        let glued = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x";
        assert!(parse(glued, None).is_none());
    }

    #[test]
    fn only_the_sampled_flag_is_kept() {
        let cx = parse(&GOOD.replace("-01", "-ff"), None).unwrap();
        assert_eq!(cx.trace_flags(), TraceFlags::SAMPLED);
    }

    #[test]
    fn tracestate_goes_with_the_parent_when_it_is_well_formed() {
        let cx = parse(GOOD, Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(cx.trace_state().get("rojo"), Some("00f067aa0ba902b7"));
        let (traceparent, state) = format(&cx);
        assert_eq!(traceparent, GOOD);
        assert_eq!(
            state.as_deref(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        // A malformed or oversized one is left out; the parent stays.
        for bad in ["no equals sign", &format!("a={}", "b".repeat(600))] {
            let cx = parse(GOOD, Some(bad)).unwrap();
            assert_eq!(cx.trace_state().header(), "");
            assert_eq!(format(&cx).1, None);
        }
    }
}
