//! Tests of the health policy: rules, hold-down, silent sources, failed chips never rounding away.

use super::*;
use crate::api::{HealthCounts, Vendor};

fn reading(node: &str, device: &str) -> DeviceReading {
    DeviceReading {
        vendor: Some(Vendor::Nvidia),
        node: Some(node.into()),
        device: device.into(),
        temperature_c: Some(50.0),
        ..Default::default()
    }
}

#[test]
fn rules_map_signals_to_status() {
    let p = Policy::default();
    let mut r = reading("n", "0");
    assert_eq!(classify(&r, &p).0, DeviceStatus::Healthy);
    r.last_xid = Some(13);
    assert_eq!(
        classify(&r, &p).0,
        DeviceStatus::Healthy,
        "application XID ignored"
    );
    r.last_xid = Some(79);
    assert_eq!(classify(&r, &p).0, DeviceStatus::Failed);
    let mut r = reading("n", "0");
    r.ecc_uncorrectable = Some(2.0);
    let (s, why) = classify(&r, &p);
    assert_eq!(s, DeviceStatus::Failed);
    assert!(why[0].contains("uncorrectable ECC"));
    let mut r = reading("n", "0");
    r.temperature_c = Some(88.0);
    assert_eq!(classify(&r, &p).0, DeviceStatus::Warning);
    r.temperature_c = Some(99.0);
    assert_eq!(classify(&r, &p).0, DeviceStatus::Degraded);
    let mut r = reading("n", "0");
    r.vendor_healthy = Some(false);
    r.error_codes = vec!["0x80E01801".into()];
    let (s, why) = classify(&r, &p);
    assert_eq!(s, DeviceStatus::Failed, "worst wins");
    assert_eq!(why.len(), 2, "every reason kept");
}

#[test]
fn recovery_waits_for_hold_down() {
    let p = Policy {
        hold_down_seconds: 60,
        ..Default::default()
    };
    let mut t = Tracker::default();
    t.sources.insert(
        "s".into(),
        SourceState {
            name: "s".into(),
            // Polls 30 s apart stay fresh: a longer gap would restart the hold-down.
            stale_after_seconds: 45,
            ..Default::default()
        },
    );
    let mut bad = reading("n", "0");
    bad.ecc_uncorrectable = Some(1.0);
    t.observe("s", vec![bad], 100, &p);
    t.observe("s", vec![reading("n", "0")], 130, &p);
    let d = &t.devices[&("n".to_string(), "0".to_string())];
    assert_eq!(d.status, DeviceStatus::Failed, "still in hold-down");
    assert!(d.reasons[0].contains("recovering"));
    t.observe("s", vec![reading("n", "0")], 161, &p);
    assert_eq!(
        t.devices[&("n".to_string(), "0".to_string())].status,
        DeviceStatus::Healthy
    );
}

#[test]
fn hold_down_is_never_shorter_than_configured() {
    // Whole-second clock: bad at 100.99 reads as 100, healthy at 102.00 as 102.
    // Only ~1 s has passed, so a 2 s hold-down must still hold.
    let p = Policy {
        hold_down_seconds: 2,
        ..Default::default()
    };
    let mut t = Tracker::default();
    let key = ("n".to_string(), "0".to_string());
    let mut bad = reading("n", "0");
    bad.last_xid = Some(79);
    t.observe("s", vec![bad], 100, &p);
    t.observe("s", vec![reading("n", "0")], 101, &p);
    assert_eq!(t.devices[&key].status, DeviceStatus::Failed);
    t.observe("s", vec![reading("n", "0")], 102, &p);
    assert_eq!(
        t.devices[&key].status,
        DeviceStatus::Failed,
        "released after as little as 1 s"
    );
    assert!(t.devices[&key].reasons[0].contains("counts from 103"));
    t.observe("s", vec![reading("n", "0")], 103, &p);
    assert_eq!(t.devices[&key].status, DeviceStatus::Healthy);
}

#[test]
fn stale_or_broken_sources_are_unknown_never_last_value() {
    let s = SourceState {
        name: "s".into(),
        last_success_at: Some(100),
        stale_after_seconds: 10,
        ..Default::default()
    };
    assert!(s.usable(105));
    assert!(!s.usable(111));
    assert!(s.problem(111).unwrap().contains("stale"));
    let broken = SourceState {
        last_error: Some("connection refused".into()),
        ..s
    };
    assert!(!broken.usable(101));
}

#[test]
fn a_failed_chip_never_rounds_away() {
    // 8 physical chips shared by a 4-card group and a 20-vNPU group.
    let inventory = testing::fleet();
    let node = inventory
        .nodes
        .values()
        .find(|n| n.groups.len() > 1 && n.groups.iter().all(|g| g.variant.vendor == Vendor::Huawei))
        .expect("an Ascend node with whole and vNPU groups");
    let p = Policy::default();
    let mut t = Tracker::default();
    t.sources.insert(
        "s".into(),
        SourceState {
            name: "s".into(),
            nodes: vec![node.name.clone()],
            vendor: Some(Vendor::Huawei),
            stale_after_seconds: 30,
            ..Default::default()
        },
    );
    let readings: Vec<DeviceReading> = (0..8)
        .map(|i| DeviceReading {
            vendor: Some(Vendor::Huawei),
            node: Some(node.name.clone()),
            device: i.to_string(),
            vendor_healthy: Some(i != 3),
            ..Default::default()
        })
        .collect();
    t.observe("s", readings, 100, &p);
    let snap = t.snapshot(inventory, 100);
    for g in &node.groups {
        let c = snap.counts_for(node, g);
        assert!(c.failed >= 1, "{}: {c:?}", g.variant.resource_name);
        assert_eq!(c.total(), g.capacity);
    }
}
mod last_known_bad {
    use super::super::testing::{
        NODE, SOURCE, STALE_AFTER, counts, fleet, gpus, silent_poll, watched,
    };
    use super::*;

    const ALL: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

    fn status(t: &Tracker, device: &str) -> DeviceStatus {
        t.devices[&(NODE.to_string(), device.to_string())].status
    }

    #[test]
    fn a_device_last_seen_failed_stays_out_while_its_source_is_silent() {
        let p = Policy::default();
        let inventory = fleet();
        let mut t = watched();
        t.observe(SOURCE, gpus(&ALL, &[3], &[5]), 100, &p);
        let before = counts(&t, inventory, 100);
        assert_eq!((before.failed, before.degraded, before.healthy), (1, 1, 6));
        // Unreachable, then long stale: the bad two stay out, the rest is Unknown.
        t.fail(SOURCE, "connection refused".into(), 101);
        for now in [101, 100 + 2 * STALE_AFTER, 100_000] {
            let c = counts(&t, inventory, now);
            assert_eq!(
                (c.failed, c.degraded, c.healthy, c.unknown),
                (1, 1, 0, 6),
                "at {now}"
            );
        }
        let d = &t.devices[&(NODE.to_string(), "3".to_string())];
        assert_eq!(
            d.status_text(&t.sources, 200),
            "Failed (last seen 1970-01-01T00:01:40Z, source stale since 1970-01-01T00:01:41Z)"
        );
        let ok = &t.devices[&(NODE.to_string(), "0".to_string())];
        assert_eq!(ok.effective_status(&t.sources, 200), DeviceStatus::Unknown);
        assert!(
            ok.status_text(&t.sources, 200)
                .starts_with("Unknown (last seen Healthy at 1970-01-01T00:01:40Z"),
            "{}",
            ok.status_text(&t.sources, 200)
        );
    }

    #[test]
    fn a_stale_source_without_errors_holds_the_same() {
        let p = Policy::default();
        let inventory = fleet();
        let mut t = watched();
        t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
        let c = counts(&t, inventory, 100 + STALE_AFTER + 1);
        assert_eq!((c.failed, c.unknown), (1, 7));
        let d = &t.devices[&(NODE.to_string(), "3".to_string())];
        assert!(
            d.status_text(&t.sources, 200)
                .ends_with("source stale since 1970-01-01T00:02:10Z)"),
            "{}",
            d.status_text(&t.sources, 200)
        );
    }

    #[test]
    fn recovery_after_a_silence_waits_a_full_hold_down() {
        let p = Policy {
            hold_down_seconds: 60,
            ..Default::default()
        };
        let mut t = watched();
        t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
        t.fail(SOURCE, "connection refused".into(), 110);
        // Back long after the hold-down would have ended: the silence proves
        // nothing, so the hold-down starts at the first fresh healthy reading.
        t.observe(SOURCE, gpus(&ALL, &[], &[]), 500, &p);
        assert_eq!(status(&t, "3"), DeviceStatus::Failed);
        assert!(
            t.devices[&(NODE.to_string(), "3".to_string())].reasons[0].contains("counts from 561")
        );
        for now in [520, 540, 560] {
            t.observe(SOURCE, gpus(&ALL, &[], &[]), now, &p);
            assert_eq!(status(&t, "3"), DeviceStatus::Failed, "at {now}");
        }
        t.observe(SOURCE, gpus(&ALL, &[], &[]), 561, &p);
        assert_eq!(status(&t, "3"), DeviceStatus::Healthy);
        assert_eq!(status(&t, "0"), DeviceStatus::Healthy, "never held");
    }

    #[test]
    fn a_bad_device_its_source_stops_reporting_stays_out() {
        let p = Policy {
            hold_down_seconds: 10,
            ..Default::default()
        };
        let inventory = fleet();
        let mut t = watched();
        t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
        // GPU 3 fell off the bus: the exporter answers for the other seven.
        let others: Vec<u32> = ALL.iter().copied().filter(|i| *i != 3).collect();
        t.observe(SOURCE, gpus(&others, &[], &[]), 101, &p);
        let c = counts(&t, inventory, 101);
        assert_eq!((c.failed, c.healthy, c.unknown), (1, 7, 0));
        let d = &t.devices[&(NODE.to_string(), "3".to_string())];
        assert_eq!(
            d.status_text(&t.sources, 101),
            "Failed (last seen 1970-01-01T00:01:40Z, not reported since 1970-01-01T00:01:41Z)"
        );
        // Back and healthy: out for a full hold-down from its first fresh reading.
        t.observe(SOURCE, gpus(&ALL, &[], &[]), 200, &p);
        assert_eq!(status(&t, "3"), DeviceStatus::Failed);
        t.observe(SOURCE, gpus(&ALL, &[], &[]), 211, &p);
        assert_eq!(status(&t, "3"), DeviceStatus::Healthy);
        // A healthy device that vanishes is forgotten, as before.
        t.observe(SOURCE, gpus(&others, &[], &[]), 212, &p);
        assert!(!t.devices.contains_key(&(NODE.to_string(), "3".to_string())));
    }

    #[test]
    fn a_bad_device_outlives_its_removed_source() {
        let p = Policy::default();
        let inventory = fleet();
        let mut t = watched();
        t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
        // The node's exporter pod went away: no source covers the node any more.
        t.remove_source(SOURCE, 150);
        let c = counts(&t, inventory, 150);
        assert_eq!((c.failed, c.unknown), (1, 7), "{c:?}");
        // With nothing bad to remember, the group falls back to the Node's view.
        let mut clean = watched();
        clean.observe(SOURCE, gpus(&ALL, &[], &[]), 100, &p);
        clean.remove_source(SOURCE, 150);
        assert!(clean.devices.is_empty());
        assert_eq!(counts(&clean, inventory, 150).healthy, 8);
    }

    proptest::proptest! {
        /// No sequence of silent polls (unreachable, unparseable, stale, an answer
        /// without the bad devices, the source removed) lowers the bad count.
        #[test]
        fn silence_never_lowers_the_bad_count(
            failed in proptest::collection::btree_set(0u32..8, 0..4),
            degraded in proptest::collection::btree_set(0u32..8, 0..4),
            events in proptest::collection::vec((0u8..4, 1i64..200), 1..12),
        ) {
            let p = Policy::default();
            let inventory = fleet();
            let failed: Vec<u32> = failed.into_iter().collect();
            let degraded: Vec<u32> = degraded.into_iter().collect();
            let mut t = watched();
            t.observe(SOURCE, gpus(&ALL, &failed, &degraded), 100, &p);
            let out = |c: HealthCounts| c.failed + c.degraded;
            let bad = out(counts(&t, inventory, 100));
            let mut now = 100;
            let silenced: Vec<u32> = failed.iter().chain(&degraded).copied().collect();
            for (event, dt) in events {
                now += dt;
                silent_poll(&mut t, event, now, &silenced);
                proptest::prop_assert!(out(counts(&t, inventory, now)) >= bad);
            }
        }
    }
}

#[test]
fn a_trend_verdict_takes_the_device_out_and_says_why() {
    use crate::health::policy::testing::{NODE, SOURCE, counts, fleet, gpus, watched};
    let policy = Policy::default();
    let mut t = watched();
    // GPU 3's correctable ECC count climbs 30 per 15 s poll; the others stay flat.
    for poll in 0..5 {
        let now = 1000 + poll * 15;
        let mut readings = gpus(&[0, 1, 2, 3, 4, 5, 6, 7], &[], &[]);
        for r in &mut readings {
            let rising = r.device == "3";
            r.ecc_correctable = Some(if rising { 30.0 * poll as f64 } else { 9000.0 });
            r.signal_fields.insert(
                "eccCorrectable",
                vec!["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL".into()],
            );
        }
        t.observe(SOURCE, readings, now, &policy);
    }
    let now = 1000 + 4 * 15;
    let gpu3 = &t.devices[&(NODE.to_string(), "3".to_string())];
    assert_eq!(gpu3.status, DeviceStatus::Degraded);
    assert_eq!(gpu3.verdicts[0].rule, "correctable-ecc-rising");
    assert_eq!(gpu3.verdicts[0].value, 120.0);
    assert!(
        gpu3.reasons[0].contains("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
        "{:?}",
        gpu3.reasons
    );
    let flat = &t.devices[&(NODE.to_string(), "0".to_string())];
    assert_eq!(flat.status, DeviceStatus::Healthy, "9000 but flat");
    let c = counts(&t, fleet(), now);
    assert_eq!((c.healthy, c.degraded), (7, 1));
    // Its source gone, the card a trend took out stays out (silence never undoes).
    t.remove_source(SOURCE, now);
    let gpu3 = &t.devices[&(NODE.to_string(), "3".to_string())];
    assert_eq!(gpu3.status, DeviceStatus::Degraded);
    assert_eq!(gpu3.unreported_since, Some(now));
}

#[test]
fn the_snapshot_names_the_trend_rules_holding_per_group() {
    use crate::health::policy::testing::{NODE, SOURCE, fleet, gpus, watched};
    let policy = Policy::default();
    let mut t = watched();
    for poll in 0..40 {
        let mut readings = gpus(&[0, 1, 2, 3, 4, 5, 6, 7], &[], &[]);
        // GPU 5 is at 90 °C for ten minutes: Warning per sample, Degraded by the rule.
        readings[5].temperature_c = Some(90.0);
        t.observe(SOURCE, readings, 1000 + poll * 15, &policy);
    }
    let snapshot = t.snapshot(fleet(), 1000 + 39 * 15);
    let rules: Vec<&String> = snapshot.trend_rules_for(NODE, "nvidia.com/gpu").collect();
    assert_eq!(rules, ["sustained-heat"]);
    assert_eq!(snapshot.groups[NODE]["nvidia.com/gpu"].degraded, 1);
}

#[test]
fn status_changes_are_kept_per_device_and_bounded() {
    use crate::health::policy::testing::{NODE, SOURCE, gpus, watched};
    let policy = Policy {
        hold_down_seconds: 0,
        ..Policy::default()
    };
    let mut t = watched();
    // GPU 1 alternates hot and cool; GPU 0 stays healthy.
    for poll in 0..40 {
        let hot: &[u32] = if poll % 2 == 1 { &[1] } else { &[] };
        t.observe(SOURCE, gpus(&[0, 1], &[], hot), 1000 + poll * 15, &policy);
    }
    let key = |i: &str| (NODE.to_string(), i.to_string());
    assert!(t.devices[&key("0")].transitions.is_empty(), "never changed");
    let flapping = &t.devices[&key("1")].transitions;
    assert_eq!(flapping.len(), TRANSITIONS_KEPT);
    let last = flapping.last().unwrap();
    // The last poll (39) was hot.
    assert_eq!(
        (last.from, last.to, last.at),
        (
            Some(DeviceStatus::Healthy),
            DeviceStatus::Degraded,
            1000 + 39 * 15
        )
    );
    assert!(
        last.reasons[0].contains("temperature"),
        "{:?}",
        last.reasons
    );
    let before = &flapping[flapping.len() - 2];
    assert_eq!(
        (before.from, before.to),
        (Some(DeviceStatus::Degraded), DeviceStatus::Healthy)
    );
}

/// GPU `i` of the watched node as DCGM reports it, with its UUID and PCI address.
fn identified(i: u32, pod: Option<&str>) -> DeviceReading {
    use crate::health::exporters::PodRef;
    use crate::health::policy::testing::NODE;
    DeviceReading {
        uuid: Some(format!("GPU-{i:04}")),
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + i)),
        pod: pod.map(|p| PodRef {
            namespace: "ml".into(),
            name: p.into(),
            container: Some("main".into()),
        }),
        ..reading(NODE, &i.to_string())
    }
}

/// A DRA device of the watched node allocated through `claim` to `pods`.
fn claimed(
    device: &str,
    uuid: Option<&str>,
    pci: Option<&str>,
    claim: &str,
    pods: &[&str],
) -> crate::inventory::holders::ClaimedDevice {
    use crate::health::policy::testing::NODE;
    crate::inventory::holders::ClaimedDevice {
        id: crate::inventory::holders::DraDeviceId {
            driver: "gpu.nvidia.com".into(),
            pool: NODE.into(),
            device: device.into(),
        },
        namespace: "ml".into(),
        claim: claim.into(),
        pods: pods.iter().map(|p| p.to_string()).collect(),
        ids: crate::inventory::PublishedIds {
            node: Some(NODE.into()),
            uuid: uuid.map(str::to_string),
            pci_address: pci.map(str::to_string),
        },
    }
}

#[test]
fn a_claimed_dra_device_is_held_by_its_claims_pod_and_named_for_the_ledger() {
    use crate::health::policy::testing::{NODE, SOURCE, watched};
    use crate::inventory::holders::Holder;
    let mut t = watched();
    // GPU 0: the exporter names its pod. GPU 1: matched to its claim by UUID (the
    // driver writes it in lower case). GPU 2: by PCI address (the driver's form,
    // DCGM's is 8-digit). GPU 3: nobody. A DRA device no exporter reports (gpu-9)
    // is still named for the ledger.
    let readings = vec![
        identified(0, Some("infer-0")),
        identified(1, None),
        identified(2, None),
        identified(3, None),
    ];
    t.observe(SOURCE, readings, 1000, &Policy::default());
    let devices = [
        claimed(
            "gpu-1",
            Some("gpu-0001"),
            None,
            "train-0-gpus",
            &["train-0"],
        ),
        claimed(
            "gpu-2",
            None,
            Some("0000:1a:00.0"),
            "train-0-gpus",
            &["train-0"],
        ),
        claimed("gpu-9", None, None, "train-0-gpus", &["train-0"]),
        claimed("gpu-5", Some("GPU-0005"), None, "other", &["other-0"]),
    ];
    t.set_claimed(devices.into_iter().map(|c| (c.id.clone(), c)).collect());
    for (pod, workload) in [("train-0", "job-train"), ("infer-0", "job-infer")] {
        t.holders.insert(
            ("ml".into(), pod.into()),
            Holder {
                namespace: "ml".into(),
                pod: pod.into(),
                workload: Some(workload.into()),
                ..Default::default()
            },
        );
    }
    let holder = |i: &str| t.holder_of(&t.devices[&(NODE.to_string(), i.to_string())]);
    let h0 = holder("0").expect("the exporter's pod");
    assert_eq!((h0.pod.as_str(), h0.claim), ("infer-0", None));
    for gpu in ["1", "2"] {
        let h = holder(gpu).expect("the claim's pod");
        assert_eq!(
            (h.pod.as_str(), h.claim.as_deref(), h.workload.as_deref()),
            ("train-0", Some("train-0-gpus"), Some("job-train")),
            "GPU {gpu}"
        );
    }
    assert_eq!(holder("3"), None, "nobody holds GPU 3: nothing guessed");
    // The ledger names GPUs 1 and 2 as the exporter does (not the driver's
    // spelling), and gpu-9, which no exporter reports, by its DRA identity.
    assert_eq!(
        t.devices_held_by("ml", "job-train"),
        [
            "GPU-0001".to_string(),
            "GPU-0002".into(),
            format!("gpu.nvidia.com/{NODE}/gpu-9")
        ]
    );
    assert_eq!(t.devices_held_by("ml", "job-infer"), ["GPU-0000"]);
    let pods: Vec<String> = t.attributed_pods().into_iter().map(|(_, p)| p).collect();
    assert_eq!(pods, ["infer-0", "other-0", "train-0"]);
    // The claims are released: GPU 1 and 2 are held by nobody again.
    t.set_claimed(Default::default());
    let gpu1 = &t.devices[&(NODE.to_string(), "1".to_string())];
    assert_eq!(t.holder_of(gpu1), None);
    assert!(t.devices_held_by("ml", "job-train").is_empty());
}

/// Each card's firmware reaches the planner from its last reading, also once its
/// exporter went silent (a fact, not health); cards no reading names are not
/// counted.
#[test]
fn the_snapshot_carries_each_cards_last_reported_firmware() {
    use super::testing::{NODE, STALE_AFTER, fleet, gpus, watched};
    let p = Policy::default();
    let mut t = watched();
    let mut readings = gpus(&[0, 1, 2, 3, 4, 5, 6], &[], &[]);
    for r in &mut readings {
        r.firmware_version = Some(
            if r.device == "6" {
                "96.00.5A.00.01"
            } else {
                "96.00.89.00.01"
            }
            .into(),
        );
    }
    readings[5].firmware_version = None;
    t.observe(super::testing::SOURCE, readings, 100, &p);
    let want = std::collections::BTreeMap::from([
        ("96.00.5A.00.01".to_string(), 1),
        ("96.00.89.00.01".to_string(), 5),
    ]);
    let snap = t.snapshot(fleet(), 100);
    assert_eq!(snap.firmware_of(NODE, "nvidia.com/gpu"), Some(&want));
    // Silent long past staleness: the health is Unknown, the firmware stays.
    let later = t.snapshot(fleet(), 100 + 10 * STALE_AFTER);
    assert_eq!(later.firmware_of(NODE, "nvidia.com/gpu"), Some(&want));
    assert_eq!(later.firmware_of("gpu-h100-02", "nvidia.com/gpu"), None);
}

/// A restarted kaccel waits for these before it plans: a source counts until it
/// answered or failed once.
#[test]
fn a_source_is_unanswered_until_its_first_answer_or_failure() {
    use super::testing::{SOURCE, gpus, watched};
    let p = Policy::default();
    let mut t = watched();
    assert_eq!(t.unanswered_sources(), [SOURCE]);
    t.observe(SOURCE, gpus(&[0], &[], &[]), 100, &p);
    assert!(t.unanswered_sources().is_empty());
    let mut t = watched();
    t.fail(SOURCE, "connection refused".into(), 100);
    assert!(t.unanswered_sources().is_empty());
}

/// The per-source index that lets a poll visit its own devices only: after any
/// mix of answers (devices taken over by another source, failed devices held
/// out, siblings kept, sources removed) it names exactly each source's devices,
/// and a held-out device is still held.
#[test]
fn each_sources_devices_are_indexed_through_takeovers_hold_outs_and_removals() {
    let p = Policy::default();
    let mut t = Tracker::default();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let mut held_out = 0;
    for step in 0..400 {
        let now = 1_000 + step * 5;
        let source = format!("src-{}", next(3));
        if next(10) == 0 {
            t.remove_source(&source, now);
        } else {
            let node = format!("n-{}", next(3));
            let mut readings: Vec<DeviceReading> = Vec::new();
            for i in 0..4 {
                if next(4) == 0 {
                    continue;
                }
                let mut r = reading(&node, &format!("{i}"));
                if next(12) == 0 {
                    r.last_xid = Some(79);
                }
                readings.push(r);
            }
            t.observe(&source, readings, now, &p);
        }
        assert!(t.source_index_is_exact(), "step {step}: {source}");
        held_out += t
            .devices
            .values()
            .filter(|d| d.unreported_since.is_some() && d.status == DeviceStatus::Failed)
            .count();
    }
    assert!(held_out > 0, "the sequence held failed devices out");
}

/// The snapshot visits only the nodes a source covers or a tracked device sits
/// on: a covered node its source reports nothing for is Unknown (never made up
/// healthy), a node with readings but no covering source is counted from them,
/// and every other node keeps the Node's own view (no entry).
#[test]
fn the_snapshot_speaks_for_watched_nodes_only() {
    use super::testing::{NODE, SOURCE, fleet, watched};
    let inventory = fleet();
    let p = Policy::default();
    let mut t = watched();
    // The covering source answers, about no GPU at all.
    t.observe(SOURCE, Vec::new(), 100, &p);
    // Readings of another node's GPUs, through a source that names no nodes
    // and no vendor (covers nothing).
    t.sources.insert(
        "loose".into(),
        SourceState {
            name: "loose".into(),
            stale_after_seconds: 30,
            ..Default::default()
        },
    );
    let other = inventory
        .nodes
        .values()
        .find(|n| {
            n.name != NODE
                && n.groups
                    .iter()
                    .any(|g| g.variant.vendor == Vendor::Nvidia && g.capacity > 0)
        })
        .expect("a second NVIDIA node");
    t.observe(
        "loose",
        vec![
            reading(&other.name, "0"),
            reading("not-in-the-inventory", "0"),
        ],
        100,
        &p,
    );
    let snap = t.snapshot(inventory, 100);
    let node = &inventory.nodes[NODE];
    let gpus = node
        .groups
        .iter()
        .find(|g| g.variant.vendor == Vendor::Nvidia)
        .expect("NODE has GPUs");
    let covered = snap.groups[NODE][&gpus.variant.resource_name];
    assert_eq!(covered.unknown, gpus.capacity, "{covered:?}");
    assert_eq!(covered.healthy, 0);
    let read = snap.groups[&other.name]
        .values()
        .map(|c| c.healthy)
        .sum::<u32>();
    assert!(read >= 1, "{:?}", snap.groups[&other.name]);
    let mut visited: Vec<&str> = snap.groups.keys().map(String::as_str).collect();
    visited.sort_unstable();
    let mut want = vec![NODE, other.name.as_str()];
    want.sort_unstable();
    assert_eq!(visited, want);
}
