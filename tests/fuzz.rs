//! Hostile input, never a panic: the parsers kaccel feeds with bytes it does not
//! control, driven with arbitrary bytes and with mutations of real inputs.
//!
//! - the Prometheus text parser (every exporter's `/metrics` body),
//! - the Prometheus query-API answer reader (health sources with `prometheus:`),
//! - the YAML loader of `kaccel plan` / `kaccel inventory`, and the validation and
//!   planning of what it loads,
//! - the ledger's CSV and JSON exports, read back: entries with arbitrary text and
//!   extreme numbers round-trip exactly (and FOCUS rows are written or refused).
//!
//! Each target runs `KACCEL_FUZZ_CASES` cases (default 2,000: the fast form
//! `cargo test` runs) from the fixed seed `KACCEL_FUZZ_SEED`, so a failure repeats.
//! `e2e/fuzz.sh` runs the long form (1,000,000 cases per target, release build)
//! and reports each target's time and peak memory. A rejection must say what was
//! wrong: the checks below hold every error message to that.

use std::path::Path;

use kaccel::cli::load::{LoadError, Loaded, load_text};
use kaccel::health::{HealthSnapshot, prom, promql};
use kaccel::inventory::Inventory;
use kaccel::ledger::entry::{Entry, EntryKind};
use kaccel::ledger::export::{Exporter, Format, Parties, Pricing, read_csv_table};
use kaccel::ledger::store::StoredEntry;
use kaccel::plan::{PlanInput, PlanOptions, plan};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config() -> Config {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
            })
            .unwrap_or(default)
    };
    Config {
        cases: env("KACCEL_FUZZ_CASES", 2_000) as u32,
        rng_seed: RngSeed::Fixed(env("KACCEL_FUZZ_SEED", 20_261_205)),
        failure_persistence: None,
        // A long run shrinks a failure for as long as it takes, not forever.
        max_shrink_iters: 2_000,
        ..Config::default()
    }
}

/// One edit of a mutation: what, where (modulo the length), which bytes.
type Edit = (u8, usize, Vec<u8>);

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for (op, at, data) in edits {
        let len = bytes.len();
        let at = if len == 0 { 0 } else { at % (len + 1) };
        match op % 6 {
            0 => {
                bytes.splice(at..at, data.iter().copied());
            }
            1 => {
                let end = (at + 1 + data.len() * 8).min(len);
                bytes.drain(at.min(end)..end);
            }
            2 => {
                for (i, b) in data.iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
            3 => {
                // Repeat a slice of the input in place: deep nesting, long lines.
                let end = (at + 1 + data.len() * 16).min(len);
                let copy: Vec<u8> = bytes[at.min(end)..end].to_vec();
                for _ in 0..(data.first().copied().unwrap_or(1) % 8) {
                    bytes.splice(at..at, copy.iter().copied());
                }
            }
            4 => bytes.truncate(at),
            _ => {
                // Structure-breaking characters the parsers treat specially.
                let special = b"{}[]\"\\,:=#\n\r\t -.eE0123456789\x00\xff";
                for (i, b) in data.iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i * 7) {
                        *slot = special[*b as usize % special.len()];
                    }
                }
            }
        }
    }
    bytes
}

/// Arbitrary bytes, or a real input with up to 12 edits.
fn input(corpus: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
    let edit = (any::<u8>(), any::<usize>(), vec(any::<u8>(), 0..24));
    prop_oneof![
        1 => vec(any::<u8>(), 0..2_048),
        3 => (0..corpus.len(), vec(edit, 0..12))
            .prop_map(move |(i, edits)| apply(corpus[i].to_vec(), &edits)),
    ]
}

/// What the HTTP client hands the parsers: the body as UTF-8 (the scraper refuses
/// other bytes, "body unreadable: not UTF-8"; lossy keeps the fuzz input useful).
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const EXPOSITION: &[&[u8]] = &[
    include_bytes!("../src/health/testdata/dcgm.prom"),
    include_bytes!("../src/health/testdata/amd.prom"),
    include_bytes!("../src/health/testdata/gaudi.prom"),
    include_bytes!("../src/health/testdata/ascend.prom"),
    b"# HELP x y\n# TYPE x gauge\nx{a=\"1\",b=\"\\\"q\\\"\\n\"} 1.5e3 1700000000000\n# EOF\n",
];

const QUERY_ANSWERS: &[&[u8]] = &[
    br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"DCGM_FI_DEV_XID_ERRORS","gpu":"0","Hostname":"n1","UUID":"GPU-1"},"value":[1700000000.123,"79"]}]}}"#,
    br#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"amd_gpu_health","gpu_id":"1"},"values":[[100.0,"1"],[115,"NaN"],[116,"+Inf"]]},{"metric":{"__name__":"h"},"histograms":[[115,{"count":"1"}]]}]},"warnings":["w"]}"#,
    br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#,
];

const YAML: &[&[u8]] = &[
    include_bytes!("../examples/classes.yaml"),
    include_bytes!("../examples/budgets.yaml"),
    include_bytes!("../examples/nodes.yaml"),
];

/// A rejection names the line and says what is wrong there.
fn check_exposition(body: &str) {
    match prom::parse(body) {
        Ok(samples) => {
            for s in samples {
                assert!(!s.name.is_empty(), "a sample without a name: {s:?}");
            }
        }
        Err(e) => {
            let lines = body.split('\n').count();
            assert!(e.line <= lines, "line {} of {lines}: {e}", e.line);
            assert!(e.message.trim().len() > 3, "an empty reason: {e:?}");
            assert!(!e.message.chars().any(char::is_control), "{e:?}");
        }
    }
}

/// A rejection says which part of the answer is wrong (a fixed prefix per kind),
/// and text echoed from the server cannot break a log line.
fn check_answer(body: &str) {
    if let Err(e) = promql::parse(body) {
        let message = e.to_string();
        assert!(
            [
                "answer is ",
                "Prometheus reported an error: ",
                "result type ",
            ]
            .iter()
            .any(|prefix| message.starts_with(prefix) && message.len() > prefix.len()),
            "a rejection that says nothing: {message:?}"
        );
        assert!(!message.chars().any(char::is_control), "{message:?}");
    }
}

/// Every error starts with the file it is about and says more than that.
fn check_yaml(body: &str) {
    let path = Path::new("fuzz.yaml");
    let mut loaded = Loaded::default();
    let mut errors: Vec<LoadError> = Vec::new();
    load_text(path, body, &mut loaded, &mut errors);
    for e in &errors {
        let message = e.to_string();
        assert!(
            message.starts_with("fuzz.yaml: ") && message.len() > "fuzz.yaml: ".len() + 5,
            "{message:?}"
        );
    }
    if errors.is_empty() {
        // What loads, plans and prints (as `kaccel plan` goes on to do).
        let inventory = Inventory::from_nodes_and_slices(&loaded.nodes, &loaded.slices);
        let plan = plan(&PlanInput {
            classes: &loaded.classes,
            budgets: &loaded.budgets,
            inventory: &inventory,
            health: &HealthSnapshot::default(),
            options: &PlanOptions::default(),
        });
        let _ = kaccel::cli::plan_yaml(&plan);
    }
}

fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ ,\"\r\n\ta-z\u{0}\u{feff}é中]{0,12}",
        Just(String::new()),
    ]
}

prop_compose! {
    fn arb_entry()(
        id in any::<i64>(),
        kind in 0usize..6,
        text in vec(arb_text(), 12),
        admission in any::<u32>(),
        device_units in prop_oneof![0u64..100_000, any::<u64>()],
        times in prop_oneof![
            (0i64..5_000_000_000, 0i64..5_000_000_000, 0i64..5_000_000_000),
            (any::<i64>(), any::<i64>(), any::<i64>()),
        ],
        credits in any::<i64>(),
        rate in any::<u64>(),
        devices in vec("[^ ]{1,40}", 0..4),
    ) -> StoredEntry {
        let mut text = text.into_iter();
        let mut next = || text.next().unwrap();
        StoredEntry {
            id,
            entry: Entry {
                key: next(),
                kind: EntryKind::ALL[kind],
                budget: next(),
                team: next(),
                namespace: next(),
                workload: next(),
                workload_uid: next(),
                admission,
                class: next(),
                flavor: next(),
                resource: next(),
                device_units,
                start: times.0,
                end: times.1,
                credits,
                rate_card: next(),
                reason: next(),
                created_at: times.2,
                rate,
                devices,
                cluster: String::new(),
            },
        }
    }
}

/// CSV and JSON read back to the entry; FOCUS writes a row or refuses it by name.
fn check_export(s: &StoredEntry) {
    let write = |format| {
        let mut ex = Exporter::new(
            Vec::new(),
            format,
            Pricing::new("EUR", "0.5").unwrap(),
            Parties::default(),
        )
        .unwrap();
        let written = ex.write(s).map_err(|e| e.to_string());
        (written, String::from_utf8(ex.finish().unwrap()).unwrap())
    };
    let e = &s.entry;

    let (written, json) = write(Format::Json);
    written.unwrap();
    let mut value: serde_json::Value = serde_json::from_str(json.trim_end()).unwrap();
    let object = value.as_object_mut().unwrap();
    assert_eq!(object.remove("id"), Some(s.id.into()));
    object.remove("creditsDecimal").expect("creditsDecimal");
    let back: Entry = serde_json::from_value(value).unwrap();
    assert_eq!(&back, e);

    let (written, _) = write(Format::Focus);
    if let Err(message) = written {
        assert!(
            message.contains(&format!("ledger entry id {}", s.id)),
            "{message}"
        );
    }

    let (written, csv) = write(Format::Csv);
    if let Err(message) = written {
        // Only an interval no 128-bit arithmetic holds is refused, by its id.
        let seconds = i128::from(e.end.saturating_sub(e.start).max(0));
        assert!(
            (i128::from(e.device_units) * seconds)
                .checked_mul(1_000_000)
                .is_none()
                && message.starts_with(&format!("ledger entry id {} (", s.id)),
            "{message}"
        );
        return;
    }
    let rows = read_csv_table(&csv).expect("a header and a row as wide as it");
    assert_eq!(rows.len(), 1, "{csv:?}");
    let row = &rows[0];
    let col = |name: &str| row[name].clone().unwrap_or_default();
    for (name, value) in [
        ("key", &e.key),
        ("budget", &e.budget),
        ("team", &e.team),
        ("namespace", &e.namespace),
        ("workload", &e.workload),
        ("workloadUid", &e.workload_uid),
        ("class", &e.class),
        ("flavor", &e.flavor),
        ("resource", &e.resource),
        ("rateCard", &e.rate_card),
        ("reason", &e.reason),
    ] {
        assert_eq!(&col(name), value, "column {name} of {csv:?}");
    }
    assert_eq!(col("id"), s.id.to_string());
    assert_eq!(col("kind"), e.kind.as_str());
    assert_eq!(col("admission"), e.admission.to_string());
    assert_eq!(col("deviceUnits"), e.device_units.to_string());
    assert_eq!(col("devices"), e.devices.join(" "));
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn exposition_text_never_panics(bytes in input(EXPOSITION)) {
        check_exposition(&text(&bytes));
    }

    #[test]
    fn query_answers_never_panic(bytes in input(QUERY_ANSWERS)) {
        check_answer(&text(&bytes));
    }

    #[test]
    fn plan_yaml_never_panics(bytes in input(YAML)) {
        check_yaml(&text(&bytes));
    }

    #[test]
    fn exports_round_trip_any_entry(entry in arb_entry()) {
        check_export(&entry);
    }
}
