//! Tests of the exposition parser: real exporter output, errors, size limits, round trips.

use super::*;
use proptest::prelude::*;

use crate::testkit::labels;

#[test]
fn empty_and_blank_bodies_are_empty() {
    assert_eq!(parse(""), Ok(vec![]));
    assert_eq!(parse("\n\r\n  \n"), Ok(vec![]));
}

#[test]
fn comments_only_is_ok() {
    let body = "# HELP up Whether up.\n# TYPE up gauge\n# just a note\n";
    assert_eq!(parse(body), Ok(vec![]));
}

#[test]
fn plain_samples_with_help_type_and_crlf() {
    let body = "# HELP a_total Things.\r\n# TYPE a_total counter\r\na_total 3\r\nb{x=\"1\"} 2.5 1700000000000\r\n";
    let s = parse(body).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].name, "a_total");
    assert_eq!(s[0].value, 3.0);
    assert!(s[0].labels.is_empty());
    assert_eq!(s[1].labels, labels(&[("x", "1")]));
    assert_eq!(s[1].timestamp_ms, Some(1_700_000_000_000));
}

#[test]
fn special_values_and_scientific_notation() {
    let body = "a NaN\nb +Inf\nc -Inf\nd 1.5e3\ne -2E-2\nf Inf\n";
    let s = parse(body).unwrap();
    assert!(s[0].value.is_nan());
    assert_eq!(s[1].value, f64::INFINITY);
    assert_eq!(s[2].value, f64::NEG_INFINITY);
    assert_eq!(s[3].value, 1500.0);
    assert_eq!(s[4].value, -0.02);
    assert_eq!(s[5].value, f64::INFINITY);
}

#[test]
fn escapes_empty_values_trailing_comma_and_blanks() {
    let body = "m{a=\"q\\\"uote\",b=\"back\\\\slash\",c=\"new\\nline\",d=\"\",} 1  \t\n  n { x = \"1\" , } 2\n";
    let s = parse(body).unwrap();
    assert_eq!(
        s[0].labels,
        labels(&[
            ("a", "q\"uote"),
            ("b", "back\\slash"),
            ("c", "new\nline"),
            ("d", "")
        ])
    );
    assert_eq!(s[1].labels, labels(&[("x", "1")]));
    assert_eq!(s[1].value, 2.0);
}

#[test]
fn label_values_may_hold_braces_hashes_and_unicode() {
    let s = parse("m{a=\"}{# ,=\",b=\"Grüße ✓\"} 7\n").unwrap();
    assert_eq!(s[0].labels, labels(&[("a", "}{# ,="), ("b", "Grüße ✓")]));
}

#[test]
fn open_metrics_eof_created_exemplar_and_second_timestamps() {
    let body = "# TYPE req counter\n# UNIT req_seconds seconds\nreq_total{a=\"b\"} 5 # {trace_id=\"abc\"} 1.0 1700000000.5\nreq_created{a=\"b\"} 1700000000.123\nreq_total{a=\"c\"} 6 1700000000.25\n# EOF\n";
    let s = parse(body).unwrap();
    assert_eq!(s.len(), 3);
    assert_eq!(s[0].value, 5.0);
    assert_eq!(s[0].timestamp_ms, None);
    assert_eq!(s[1].name, "req_created");
    assert_eq!(s[2].timestamp_ms, Some(1_700_000_000_250));
}

#[test]
fn content_after_eof_is_an_error() {
    let err = parse("a 1\n# EOF\nb 2\n").unwrap_err();
    assert_eq!(err.line, 3);
}

#[test]
fn garbage_is_an_error() {
    for body in [
        "<html><body>502 Bad Gateway</body></html>",
        "404 page not found\n",
        "Not Found",
        "{\"error\":\"boom\"}",
        "a 1\nb\n",
        "a{b=\"1\" 1\n",
        "a{b=1} 1\n",
        "a{1b=\"x\"} 1\n",
        "a{b=\"x\",b=\"y\"} 1\n",
        "a 1 notatimestamp\n",
        "a 1 2 3\n",
        "a one\n",
        "a{b=\"unterminated} 1\n",
        "# TYPE a bogus\n",
        "# TYPE 1a gauge\n",
        "\u{0}\u{1}\u{2}",
        "a\u{0} 1\n",
        "a 1\u{fffd}\n",
    ] {
        assert!(parse(body).is_err(), "{body:?} should not parse");
    }
}

#[test]
fn error_names_the_line() {
    let err = parse("# HELP x y\nx 1\n<html>\n").unwrap_err();
    assert_eq!(err.line, 3);
    assert!(err.to_string().starts_with("line 3: "), "{err}");
}

#[test]
fn oversized_line_is_rejected_with_a_clear_error() {
    let long = format!("a{{b=\"{}\"}} 1\n", "x".repeat(MAX_LINE_BYTES));
    let err = parse(&long).unwrap_err();
    assert_eq!(err.line, 1);
    assert!(err.message.contains("1 MiB"), "{err}");
}

#[test]
fn oversized_body_is_rejected_with_a_clear_error() {
    let line = "metric_name_padding{l=\"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\"} 1\n";
    let body = line.repeat(MAX_BODY_BYTES / line.len() + 1);
    let err = parse(&body).unwrap_err();
    assert_eq!(err.line, 0);
    assert!(err.message.contains("64 MiB"), "{err}");
}

#[test]
fn timestamp_out_of_range_is_an_error() {
    assert!(parse("a 1 99999999999999999999\n").is_err());
    assert!(parse("a 1 1e300\n# EOF\n").is_err());
    assert_eq!(
        parse("a 1 -5\n").unwrap()[0].timestamp_ms,
        Some(-5),
        "negative ms timestamps are valid"
    );
}

#[test]
fn render_writes_special_values() {
    let s = vec![Sample {
        name: "m".into(),
        labels: labels(&[("a", "x\"y\\z\nw")]),
        value: f64::NEG_INFINITY,
        timestamp_ms: Some(12),
    }];
    assert_eq!(render(&s), "m{a=\"x\\\"y\\\\z\\nw\"} -Inf 12\n");
    assert_eq!(parse(&render(&s)).unwrap(), s);
}

fn same(a: &[Sample], b: &[Sample]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.labels == y.labels
                && x.timestamp_ms == y.timestamp_ms
                && ((x.value.is_nan() && y.value.is_nan())
                    || (x.value == y.value
                        && x.value.is_sign_negative() == y.value.is_sign_negative()))
        })
}

fn arb_sample() -> impl Strategy<Value = Sample> {
    let name = "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}";
    let label = ("[a-zA-Z_][a-zA-Z0-9_]{0,12}", any::<String>());
    let value = prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(-0.0),
        (-1e6f64..1e6),
    ];
    (
        name,
        proptest::collection::btree_map(label.0, label.1, 0..5),
        value,
        proptest::option::of(any::<i64>()),
    )
        .prop_map(|(name, labels, value, timestamp_ms)| Sample {
            name,
            labels,
            value,
            timestamp_ms,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn never_panics_on_strings(s in any::<String>()) {
        let _ = parse(&s);
    }

    #[test]
    fn never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn never_panics_on_near_valid_lines(
        s in "[a-z_{}=\",#\\\\ \t\r\n0-9.eE+\\-NaIf]{0,80}",
    ) {
        let _ = parse(&s);
    }

    #[test]
    fn render_parse_round_trips(samples in proptest::collection::vec(arb_sample(), 0..8)) {
        let text = render(&samples);
        let parsed = parse(&text);
        prop_assert!(parsed.is_ok(), "{:?} for {:?}", parsed, text);
        let parsed = parsed.unwrap();
        prop_assert!(same(&parsed, &samples), "{:?} != {:?}", parsed, samples);
    }
}
