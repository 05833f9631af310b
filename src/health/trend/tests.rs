//! Trend rules over synthetic series: rising, flat, counter resets, gaps, heat,
//! throttling, recurring XIDs and fault codes.

use proptest::prelude::*;

use super::*;

const POLL: i64 = 15;
const MAX_GAP: i64 = 60;

fn nvidia() -> DeviceReading {
    DeviceReading {
        vendor: Some(Vendor::Nvidia),
        node: Some("n".into()),
        device: "GPU-0".into(),
        ..Default::default()
    }
}

/// The default policy with only `rules`.
fn with(rules: &[TrendRule]) -> Policy {
    Policy {
        trend_rules: rules.to_vec(),
        ..Policy::default()
    }
}

fn only(name: &str) -> Vec<TrendRule> {
    default_rules()
        .into_iter()
        .filter(|r| r.name == name)
        .collect()
}

/// Feed `values` of one field, one reading every `POLL` seconds from t=1000; the
/// verdicts after each reading.
fn feed(
    rules: &[TrendRule],
    samples: impl IntoIterator<Item = (i64, DeviceReading)>,
) -> Vec<Vec<TrendVerdict>> {
    let mut history = DeviceHistory::default();
    samples
        .into_iter()
        .map(|(t, r)| history.observe(&r, t, &with(rules), MAX_GAP))
        .collect()
}

fn ecc(values: &[f64]) -> Vec<(i64, DeviceReading)> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut r = nvidia();
            r.ecc_correctable = Some(*v);
            r.signal_fields.insert(
                "eccCorrectable",
                vec!["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL".into()],
            );
            (1000 + i as i64 * POLL, r)
        })
        .collect()
}

fn temps(values: &[f64]) -> Vec<(i64, DeviceReading)> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut r = nvidia();
            r.temperature_c = Some(*v);
            (1000 + i as i64 * POLL, r)
        })
        .collect()
}

#[test]
fn a_rising_correctable_count_degrades_and_names_the_vendor_field() {
    // +10 per poll: 100 in 10 polls (150 s), well inside the 600 s window.
    let series: Vec<f64> = (0..12).map(|i| 5000.0 + 10.0 * i as f64).collect();
    let verdicts = feed(&only("correctable-ecc-rising"), ecc(&series));
    assert!(verdicts[..10].iter().all(Vec::is_empty), "90 is below 100");
    let v = &verdicts[10][0];
    assert_eq!(v.status, DeviceStatus::Degraded);
    assert_eq!(v.value, 100.0);
    assert_eq!(v.fields, vec!["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL".to_string()]);
    assert_eq!(
        v.reason(),
        "rule correctable-ecc-rising: increase of eccCorrectable \
         (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL) over 600s = 100 >= 100"
    );
}

#[test]
fn a_high_but_flat_count_stays_healthy() {
    let verdicts = feed(&only("correctable-ecc-rising"), ecc(&[90_000.0; 200]));
    assert!(verdicts.iter().all(Vec::is_empty));
}

#[test]
fn a_slow_rise_spread_beyond_the_window_stays_healthy() {
    // +5 per poll = 200 per 600 s would fire; +1 per poll = 40 per 600 s never does,
    // however long it goes on (the old rise leaves the window).
    let series: Vec<f64> = (0..400).map(|i| i as f64).collect();
    let verdicts = feed(&only("correctable-ecc-rising"), ecc(&series));
    assert!(verdicts.iter().all(Vec::is_empty));
    let fast: Vec<f64> = (0..400).map(|i| 5.0 * i as f64).collect();
    assert!(!feed(&only("correctable-ecc-rising"), ecc(&fast))[399].is_empty());
}

#[test]
fn a_counter_reset_is_neither_a_fall_nor_a_spike() {
    // 50 in the window, then the exporter restarts (answers 0 once), then comes back
    // with the driver's count: no spike. Real errors after that still count.
    let mut series: Vec<f64> = (0..6).map(|i| 10_000.0 + 10.0 * i as f64).collect();
    series.push(0.0);
    series.extend([10_050.0, 10_050.0, 10_060.0]);
    let verdicts = feed(&only("correctable-ecc-rising"), ecc(&series));
    assert!(verdicts.iter().all(Vec::is_empty), "{verdicts:?}");
    let mut history = DeviceHistory::default();
    let rules = only("correctable-ecc-rising");
    let mut last = vec![];
    for (t, r) in ecc(&series) {
        last = history.observe(&r, t, &with(&rules), MAX_GAP);
    }
    let mut r = nvidia();
    r.ecc_correctable = Some(10_100.0);
    last.extend(history.observe(&r, 1000 + 10 * POLL, &with(&rules), MAX_GAP));
    assert_eq!(last[0].value, 100.0, "50 before, 10 + 40 after the restart");
}

#[test]
fn a_driver_reset_starts_a_new_count_from_zero() {
    // The counter really restarted: its rise from 0 is new errors.
    let mut series = vec![7000.0, 7000.0, 0.0];
    series.extend((1..=12).map(|i| 10.0 * i as f64));
    let verdicts = feed(&only("correctable-ecc-rising"), ecc(&series));
    assert!(verdicts[..12].iter().all(Vec::is_empty));
    assert_eq!(verdicts[12][0].value, 100.0);
}

#[test]
fn a_rise_across_a_gap_longer_than_the_window_is_not_the_window_s() {
    let rules = only("correctable-ecc-rising");
    let mut history = DeviceHistory::default();
    let mut r = nvidia();
    r.ecc_correctable = Some(0.0);
    history.observe(&r, 1000, &with(&rules), MAX_GAP);
    r.ecc_correctable = Some(500.0);
    assert!(
        history
            .observe(&r, 1000 + 3600, &with(&rules), MAX_GAP)
            .is_empty()
    );
    // A rise across a shorter gap (exporter down two minutes) is counted.
    r.ecc_correctable = Some(700.0);
    let v = history.observe(&r, 1000 + 3600 + 120, &with(&rules), MAX_GAP);
    assert_eq!(v[0].value, 200.0);
}

#[test]
fn one_hot_sample_does_nothing_and_ten_minutes_of_heat_does() {
    let rules = only("sustained-heat");
    let mut series = vec![60.0; 10];
    series.push(92.0);
    series.extend([60.0; 10]);
    assert!(feed(&rules, temps(&series)).iter().all(Vec::is_empty));
    let verdicts = feed(&rules, temps(&[90.0; 60]));
    let first = verdicts.iter().position(|v| !v.is_empty()).expect("fires");
    // 480 s above 85 °C: the 32nd interval of 15 s (the first sample is a baseline).
    assert_eq!(first, 32);
    assert_eq!(verdicts[first][0].value, 480.0);
    assert_eq!(verdicts[first][0].status, DeviceStatus::Degraded);
}

#[test]
fn a_gap_in_samples_is_neither_hot_nor_cool() {
    let rules = vec![TrendRule {
        window_seconds: 600,
        threshold: 0.5,
        function: Function::ShareAbove,
        ..only("sustained-heat").remove(0)
    }];
    let mut history = DeviceHistory::default();
    let mut r = nvidia();
    // Hot for 300 s, then a 10-minute gap, then one more hot sample.
    let mut last = vec![];
    for i in 0..=20 {
        r.temperature_c = Some(90.0);
        last = history.observe(&r, 1000 + i * POLL, &with(&rules), MAX_GAP);
    }
    assert!(!last.is_empty(), "300 s hot out of 300 observed");
    r.temperature_c = Some(90.0);
    let after_gap = history.observe(&r, 1000 + 20 * POLL + 600, &with(&rules), MAX_GAP);
    assert!(
        after_gap.is_empty(),
        "the gap's 600 s count as unobserved, so nothing is known: {after_gap:?}"
    );
}

#[test]
fn throttling_for_half_the_window_warns_and_one_sample_is_never_a_share() {
    let rules = only("clock-throttled");
    let reading = |on: bool| {
        let mut r = nvidia();
        r.clock_throttle_active = Some(on);
        r
    };
    // Throttled from the first sample: nothing until half the hour is observed.
    let verdicts = feed(&rules, (0..240).map(|i| (1000 + i * POLL, reading(true))));
    let first = verdicts.iter().position(|v| !v.is_empty()).expect("fires");
    assert_eq!(first, 120, "1800 s observed");
    assert_eq!(verdicts[first][0].status, DeviceStatus::Warning);
    // Throttled one poll in three: a third of the time, never half.
    let verdicts = feed(
        &rules,
        (0..480).map(|i| (1000 + i * POLL, reading(i % 3 == 0))),
    );
    assert!(verdicts.iter().all(Vec::is_empty));
}

#[test]
fn the_same_xid_recurring_degrades_and_application_xids_never_count() {
    let rules = only("recurring-xid");
    // dcgm-exporter's per-XID counts: XID 31 (application) rises 10 times, XID 48
    // rises three times.
    let mut history = DeviceHistory::default();
    let mut r = nvidia();
    let mut verdicts = vec![];
    for i in 0..10 {
        r.xid_counts = [(31, i as f64), (48, (i / 3) as f64)].into();
        verdicts = history.observe(&r, 1000 + i * POLL, &with(&rules), MAX_GAP);
        if i < 9 {
            assert!(verdicts.is_empty(), "step {i}: {verdicts:?}");
        }
    }
    assert_eq!(verdicts[0].key.as_deref(), Some("48"));
    assert_eq!(verdicts[0].value, 3.0);
    // From the last-XID value alone: each change to a new XID is one occurrence.
    let mut history = DeviceHistory::default();
    let mut last = vec![];
    for (i, xid) in [0, 62, 0, 62, 0, 62, 0, 62].iter().enumerate() {
        r.xid_counts.clear();
        r.last_xid = Some(*xid);
        last = history.observe(&r, 1000 + i as i64 * POLL, &with(&rules), MAX_GAP);
    }
    assert_eq!(last[0].value, 4.0);
}

#[test]
fn a_fault_code_that_keeps_coming_back_degrades() {
    let rules = only("recurring-fault-code");
    let mut history = DeviceHistory::default();
    let mut r = DeviceReading {
        vendor: Some(Vendor::Huawei),
        ..nvidia()
    };
    let mut verdicts = vec![];
    for i in 0..7 {
        r.error_codes = if i % 2 == 1 {
            vec!["0x80E01801".into()]
        } else {
            vec![]
        };
        verdicts = history.observe(&r, 1000 + i * POLL, &with(&rules), MAX_GAP);
    }
    assert_eq!(verdicts.len(), 1, "the code came back three times");
    assert_eq!(verdicts[0].key.as_deref(), Some("0x80E01801"));
}

#[test]
fn three_resets_within_the_hour_fail_the_card_and_old_ones_age_out() {
    let policy = with(&only("repeated-resets"));
    let mut history = DeviceHistory::default();
    let at = |minutes: i64| 1000 + minutes * 60;
    // The driver asks for a GPU reset (recovery action 1) and is obeyed, twice;
    // then the card falls off the bus (XID 79, counted by dcgm-exporter).
    let mut see = |minutes: i64, action: u64, xid79: f64| {
        let mut r = nvidia();
        r.recovery_action = Some(action);
        r.xid_counts = [(79, xid79)].into();
        history.observe(&r, at(minutes), &policy, 7200)
    };
    assert!(see(0, 0, 0.0).is_empty());
    assert!(see(10, 1, 0.0).is_empty());
    assert!(see(11, 0, 0.0).is_empty());
    assert!(see(20, 1, 0.0).is_empty());
    assert!(see(21, 0, 0.0).is_empty());
    let v = see(30, 0, 1.0);
    assert_eq!(v[0].status, DeviceStatus::Failed);
    assert_eq!(v[0].value, 3.0);
    assert_eq!(v[0].key, None, "resets of every cause count together");
    // An hour and a quarter later, the old resets have left the window.
    assert!(see(105, 1, 1.0).is_empty());
}

#[test]
fn rules_only_apply_to_their_vendors() {
    let rules = only("sustained-heat-junction");
    // 99 °C on an NVIDIA card: the junction rule is AMD's only.
    let verdicts = feed(&rules, temps(&[99.0; 300]));
    assert!(verdicts.iter().all(Vec::is_empty), "NVIDIA is not AMD");
    let amd: Vec<(i64, DeviceReading)> = temps(&[101.0; 60])
        .into_iter()
        .map(|(t, r)| {
            (
                t,
                DeviceReading {
                    vendor: Some(Vendor::Amd),
                    ..r
                },
            )
        })
        .collect();
    assert!(!feed(&rules, amd).last().expect("samples").is_empty());
}

#[test]
fn row_remap_pending_warns_while_it_lasts() {
    let rules = only("row-remap-pending");
    let mut history = DeviceHistory::default();
    let mut r = nvidia();
    r.row_remap_pending = Some(true);
    assert_eq!(
        history.observe(&r, 1000, &with(&rules), MAX_GAP)[0].status,
        DeviceStatus::Warning
    );
    r.row_remap_pending = Some(false);
    assert!(history.observe(&r, 1015, &with(&rules), MAX_GAP).is_empty());
}

#[test]
fn bad_rules_name_the_field_and_the_fix() {
    let good = only("correctable-ecc-rising").remove(0);
    assert_eq!(good.problem(), None);
    for rule in default_rules() {
        assert_eq!(rule.problem(), None, "{}", rule.name);
    }
    let cases = [
        (
            TrendRule {
                function: Function::DurationAbove,
                ..good.clone()
            },
            "function",
            "use one of increase, rate, latest",
        ),
        (
            TrendRule {
                signal: Signal::Temperature,
                function: Function::ShareAbove,
                threshold: 0.5,
                ..good.clone()
            },
            "above",
            "needs `above`",
        ),
        (
            TrendRule {
                window_seconds: 0,
                ..good.clone()
            },
            "windowSeconds",
            "must be 1..",
        ),
        (
            TrendRule {
                status: DeviceStatus::Healthy,
                ..good.clone()
            },
            "status",
            "Warning, Degraded or Failed",
        ),
        (
            TrendRule {
                signal: Signal::ClockThrottle,
                function: Function::ShareAbove,
                above: Some(0.0),
                threshold: 50.0,
                ..good.clone()
            },
            "threshold",
            "a share of the window",
        ),
    ];
    for (rule, field, fix) in cases {
        let (f, message) = rule.problem().expect("a problem");
        assert_eq!(f, field);
        assert!(message.contains(fix), "{message}");
        assert!(message.contains("correctable-ecc-rising"), "{message}");
    }
}

#[test]
fn rules_parse_from_the_config_s_words() {
    let rule: TrendRule = serde_yaml::from_str(
        "{name: hot, signal: temperature, function: durationAbove, above: 80, \
          windowSeconds: 300, threshold: 240, status: Degraded, vendors: [nvidia]}",
    )
    .expect("parses");
    assert_eq!(rule.signal, Signal::Temperature);
    assert_eq!(rule.function, Function::DurationAbove);
    assert_eq!(rule.vendors, vec![Vendor::Nvidia]);
    let typo = serde_yaml::from_str::<TrendRule>(
        "{name: hot, signal: temprature, function: latest, threshold: 1, status: Warning}",
    )
    .expect_err("unknown signal");
    assert!(typo.to_string().contains("temperature"), "{typo}");
}

proptest! {
    /// A counter series with resets, rises and gaps: the increase is never negative,
    /// never more than the real rises of the last window plus one gap, and a flat
    /// series (whatever its resets back to the same value) never fires.
    #[test]
    fn increase_is_bounded_by_the_real_rises(
        steps in proptest::collection::vec((0u8..4, 0u32..50, 1i64..90), 1..200),
    ) {
        let rule = TrendRule { threshold: f64::MAX, ..only("correctable-ecc-rising").remove(0) };
        let mut history = DeviceHistory::default();
        let mut state = RuleState::None;
        let mut r = nvidia();
        let mut value = 1000.0;
        let mut t = 1000;
        // (time, real rise) of every step that was a rise.
        let mut rises: Vec<(i64, f64)> = vec![];
        for (kind, amount, gap) in steps {
            t += gap;
            match kind {
                0 => {
                    value += f64::from(amount);
                    rises.push((t, f64::from(amount)));
                }
                1 => {} // flat
                2 => value = 0.0, // reset
                _ => {}
            }
            r.ecc_correctable = Some(value);
            let step = history.step(&r, t, MAX_GAP, &Policy::default());
            let (increase, _) = update(&rule, &mut state, &step, &r, t).expect("a counter value");
            prop_assert!(increase >= 0.0);
            let window = i64::from(rule.window_seconds);
            let recent: f64 = rises
                .iter()
                .filter(|(at, _)| *at > t - window - rule.bucket_seconds() - 90)
                .map(|(_, a)| a)
                .sum();
            prop_assert!(increase <= recent + 1e-6, "increase {increase} > real rises {recent}");
        }
    }

    /// A flat gauge at any level below `above`, sampled with any gaps, never fires;
    /// the seconds above never exceed the seconds observed, nor the window plus a gap.
    #[test]
    fn duration_above_is_bounded(
        steps in proptest::collection::vec((0.0f64..120.0, 1i64..120), 1..300),
    ) {
        let rule = TrendRule { threshold: f64::MAX, ..only("sustained-heat").remove(0) };
        let mut history = DeviceHistory::default();
        let mut state = RuleState::None;
        let mut r = nvidia();
        let mut t = 1000;
        for (temp, gap) in steps {
            t += gap;
            r.temperature_c = Some(temp);
            let step = history.step(&r, t, MAX_GAP, &Policy::default());
            let (above, _) = update(&rule, &mut state, &step, &r, t).expect("a gauge value");
            let RuleState::Window(ring) = &state else { panic!("a window") };
            prop_assert!(above <= ring.observed_seconds() as f64 + 1e-6);
            prop_assert!(above <= f64::from(rule.window_seconds) + rule.bucket_seconds() as f64 * 2.0 + MAX_GAP as f64);
        }
    }

    /// Whatever XIDs and codes arrive, a device remembers at most MAX_KEYS per rule:
    /// memory follows the rules, never the history.
    #[test]
    fn keyed_memory_is_bounded(
        xids in proptest::collection::vec(1u64..200, 1..400),
    ) {
        let rules = only("recurring-xid");
        let mut history = DeviceHistory::default();
        let mut r = nvidia();
        for (i, xid) in xids.iter().enumerate() {
            r.last_xid = Some(*xid);
            history.observe(&r, 1000 + i as i64 * POLL, &with(&rules), MAX_GAP);
            let RuleState::Keyed(rings) = &history.rules[0] else { panic!("keyed") };
            prop_assert!(rings.len() <= MAX_KEYS);
        }
    }
}
