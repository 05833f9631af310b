//! Tests of the FOCUS 1.2 rows: the spec's columns on a charged run, pricing edge cases, refunds.

use proptest::prelude::*;

use super::*;

/// FOCUS 1.2's mandatory columns (specification/columns/*.md at v1.2, "Feature
/// level: Mandatory"), with whether they allow nulls.
const FOCUS_1_2_MANDATORY: [(&str, bool); 21] = [
    ("BilledCost", false),
    ("BillingAccountId", false),
    ("BillingAccountName", true),
    ("BillingCurrency", false),
    ("BillingPeriodEnd", false),
    ("BillingPeriodStart", false),
    ("ChargeCategory", false),
    ("ChargeClass", true),
    ("ChargeDescription", true),
    ("ChargePeriodEnd", false),
    ("ChargePeriodStart", false),
    ("ContractedCost", false),
    ("EffectiveCost", false),
    ("InvoiceIssuerName", false),
    ("ListCost", false),
    ("PricingQuantity", true),
    ("PricingUnit", true),
    ("ProviderName", false),
    ("PublisherName", false),
    ("ServiceCategory", false),
    ("ServiceName", false),
];

/// The conditional and recommended columns that apply to kaccel (unit prices,
/// virtual pricing currency, resources, SKUs, sub accounts, tags), with whether
/// they allow nulls at all.
const FOCUS_1_2_APPLICABLE: [(&str, bool); 20] = [
    ("ChargeFrequency", false),
    ("ConsumedQuantity", true),
    ("ConsumedUnit", true),
    ("ContractedUnitPrice", true),
    ("ListUnitPrice", true),
    ("PricingCategory", true),
    ("PricingCurrency", false),
    ("PricingCurrencyContractedUnitPrice", true),
    ("PricingCurrencyEffectiveCost", false),
    ("PricingCurrencyListUnitPrice", true),
    ("ResourceId", true),
    ("ResourceName", true),
    ("ResourceType", true),
    ("ServiceSubcategory", false),
    ("SkuId", true),
    ("SkuMeter", true),
    ("SkuPriceDetails", true),
    ("SkuPriceId", true),
    ("SubAccountId", true),
    ("SubAccountName", true),
];

#[test]
fn focus_has_every_mandatory_focus_1_2_column() {
    let csv = focus_export("0.5", &[post()]);
    let header = &parse_csv(&csv)[0];
    for (name, _) in FOCUS_1_2_MANDATORY.iter().chain(&FOCUS_1_2_APPLICABLE) {
        assert!(
            header.iter().any(|h| h.as_deref() == Some(*name)),
            "FOCUS 1.2 column {name} missing from {header:?}"
        );
    }
    // FOCUS columns first, then custom ones, all custom ones prefixed x_.
    let first_custom = header
        .iter()
        .position(|h| h.as_deref().is_some_and(|h| h.starts_with("x_")))
        .unwrap();
    assert!(
        header[first_custom..]
            .iter()
            .all(|h| h.as_deref().is_some_and(|h| h.starts_with("x_")))
    );
    let row = &table(&csv)[0];
    assert_eq!(row["BillingAccountId"].as_deref(), Some("vision"));
    assert_eq!(row["SubAccountId"].as_deref(), Some("b"));
    for party in ["ProviderName", "PublisherName", "InvoiceIssuerName"] {
        assert_eq!(row[party].as_deref(), Some(DEFAULT_PROVIDER), "{party}");
    }
}

#[test]
fn focus_export_of_a_charged_run_conforms_to_focus_1_2() {
    let entries = stored(&ledger());
    let by_id: BTreeMap<String, &Entry> = entries
        .iter()
        .map(|s| (s.id.to_string(), &s.entry))
        .collect();
    let price = "0.37";
    let price_dec = dec(price);
    let rows = table(&focus_export(price, &entries));
    let charges = entries
        .iter()
        .filter(|s| matches!(s.entry.kind, EntryKind::Post | EntryKind::Correction))
        .count();
    assert_eq!(rows.len(), charges);
    let is_dt = |v: &str| {
        v.len() == 20
            && v.bytes().enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                10 => b == b'T',
                13 | 16 => b == b':',
                19 => b == b'Z',
                _ => b.is_ascii_digit(),
            })
    };
    let numeric = [
        "BilledCost",
        "ConsumedQuantity",
        "ContractedCost",
        "ContractedUnitPrice",
        "EffectiveCost",
        "ListCost",
        "ListUnitPrice",
        "PricingCurrencyContractedUnitPrice",
        "PricingCurrencyEffectiveCost",
        "PricingCurrencyListUnitPrice",
        "PricingQuantity",
    ];
    let ai_subcategories = [
        "AI Platforms",
        "Bots",
        "Generative AI",
        "Machine Learning",
        "Natural Language Processing",
        "Other (AI and Machine Learning)",
    ];
    let mut classes = BTreeMap::<String, usize>::new();
    let mut billed_by_flavor = BTreeMap::<String, (i128, u32)>::new();
    let mut seconds_by_flavor = BTreeMap::<String, i128>::new();
    for row in &rows {
        let get = |c: &str| row[c].as_deref();
        let e = by_id[get("x_LedgerEntryId").unwrap()];
        for (name, nullable) in FOCUS_1_2_MANDATORY.iter().chain(&FOCUS_1_2_APPLICABLE) {
            if !nullable {
                assert!(get(name).is_some(), "{name} is null in {row:?}");
            }
            assert_ne!(get(name), Some(""), "{name} empty instead of null");
        }
        for c in numeric {
            if let Some(v) = get(c) {
                dec(v);
            }
        }
        for c in [
            "BillingPeriodStart",
            "BillingPeriodEnd",
            "ChargePeriodStart",
            "ChargePeriodEnd",
        ] {
            assert!(is_dt(get(c).unwrap()), "{c}: {row:?}");
        }
        // Allowed values.
        let category = get("ChargeCategory").unwrap();
        assert!(["Usage", "Purchase", "Tax", "Credit", "Adjustment"].contains(&category));
        let correction = get("ChargeClass") == Some("Correction");
        assert!(correction || get("ChargeClass").is_none(), "{row:?}");
        assert!(
            ["One-Time", "Recurring", "Usage-Based"].contains(&get("ChargeFrequency").unwrap())
        );
        assert!(
            get("PricingCategory")
                .is_none_or(|v| ["Standard", "Dynamic", "Committed", "Other"].contains(&v))
        );
        assert_eq!(get("ServiceCategory"), Some("AI and Machine Learning"));
        assert!(ai_subcategories.contains(&get("ServiceSubcategory").unwrap()));
        assert_eq!(get("BillingCurrency"), Some("EUR"));
        assert_eq!(get("PricingCurrency"), Some("CREDITS"));
        let tags: serde_json::Value = serde_json::from_str(get("Tags").unwrap()).unwrap();
        assert!(tags.as_object().unwrap().values().all(|v| v.is_string()));
        // Paired nullability.
        for (a, b) in [
            ("PricingQuantity", "PricingUnit"),
            ("ConsumedQuantity", "ConsumedUnit"),
            ("SubAccountId", "SubAccountName"),
            ("ResourceId", "ResourceType"),
            ("ListUnitPrice", "ContractedUnitPrice"),
        ] {
            assert_eq!(get(a).is_none(), get(b).is_none(), "{a} vs {b}: {row:?}");
        }
        assert!(get("SkuId").is_some() || get("SkuMeter").is_none());
        assert!(get("SkuPriceId").is_some() || get("SkuPriceDetails").is_none());
        // Usage that is not a correction names its prices, quantities and SKU;
        // anything else consumed nothing.
        if category == "Usage" && !correction {
            for c in [
                "ListUnitPrice",
                "ContractedUnitPrice",
                "PricingQuantity",
                "PricingCategory",
                "ConsumedQuantity",
                "SkuId",
                "SkuPriceId",
                "PricingCurrencyListUnitPrice",
                "PricingCurrencyContractedUnitPrice",
            ] {
                assert!(get(c).is_some(), "{c} is null on usage: {row:?}");
            }
        } else {
            assert!(get("ConsumedQuantity").is_none(), "{row:?}");
        }
        // Costs.
        let billed = dec(get("BilledCost").unwrap());
        assert!(dec_eq(
            billed,
            dec_mul(dec(&format_micros(e.credits.into())), price_dec)
        ));
        assert!(dec_eq(dec(get("EffectiveCost").unwrap()), billed));
        assert!(dec_eq(
            dec(get("PricingCurrencyEffectiveCost").unwrap()),
            dec(&format_micros(e.credits.into()))
        ));
        for (unit, cost) in [
            ("ListUnitPrice", "ListCost"),
            ("ContractedUnitPrice", "ContractedCost"),
        ] {
            let cost = dec(get(cost).unwrap());
            match (get(unit), get("PricingQuantity")) {
                // listcost.md / contractedcost.md: the product MUST match.
                (Some(p), Some(q)) if !correction => {
                    assert!(dec_eq(dec_mul(dec(p), dec(q)), cost), "{unit}: {row:?}")
                }
                // A charge unrelated to others with no unit price: = BilledCost.
                (None, _) => assert!(dec_eq(cost, billed), "{row:?}"),
                _ => {}
            }
        }
        if category == "Usage" {
            let q = dec(get("PricingQuantity").unwrap());
            let device_secs = i128::from(e.device_units) * i128::from(e.end - e.start);
            assert_eq!(
                get("ConsumedQuantity"),
                Some(device_secs.to_string().as_str())
            );
            assert_eq!(get("ConsumedUnit"), Some("Device-Seconds"));
            if e.rate > 0 {
                // The rate card's rate, not a quotient of the charge.
                let rate = dec(&format_micros(e.rate.into()));
                assert!(dec_eq(
                    dec(get("PricingCurrencyListUnitPrice").unwrap()),
                    rate
                ));
                assert!(dec_eq(
                    dec(get("ListUnitPrice").unwrap()),
                    dec_mul(rate, price_dec)
                ));
                assert_eq!(get("PricingUnit"), Some("Device-Hours"));
                // Device-hours rounded half-up to the micro-device-hour.
                assert_eq!(q.1.max(6), 6);
                let micro_dh = q.0 * 10i128.pow(6 - q.1);
                assert!(
                    (micro_dh * 3600 - device_secs * 1_000_000).abs() <= 1800,
                    "{row:?}"
                );
                // ListCost and BilledCost differ by the ledger's flooring and the
                // quantity rounding only (micro-credits x 10^6).
                let gap = (i128::from(e.rate) * micro_dh - i128::from(e.credits) * 1_000_000).abs();
                assert!(
                    gap <= i128::from(e.rate) / 2 + 1_000_000,
                    "gap {gap}: {row:?}"
                );
            } else {
                assert_eq!(get("PricingUnit"), Some("Credits"));
                assert!(dec_eq(dec(get("ListCost").unwrap()), billed));
            }
            let sum = billed_by_flavor.entry(e.flavor.clone()).or_insert((0, 0));
            *sum = (
                sum.0 * 10i128.pow(billed.1.max(sum.1) - sum.1)
                    + billed.0 * 10i128.pow(billed.1.max(sum.1) - billed.1),
                billed.1.max(sum.1),
            );
            if e.workload_uid != "u-legacy" {
                *seconds_by_flavor.entry(e.flavor.clone()).or_default() += device_secs;
            }
        }
        *classes
            .entry(format!("{category}/{correction}"))
            .or_default() += 1;
    }
    // Every kind of row was seen: usage, a refund, a correction of last month.
    assert_eq!(classes.len(), 3, "{classes:?}");
    // Per flavor, BilledCost sums to the posted credits x price, and the consumed
    // device-seconds to every admitted second of every device.
    for (flavor, units) in [("nvidia-h100", 2), ("mig-1g", 7)] {
        let posted: i64 = entries
            .iter()
            .filter(|s| s.entry.kind == EntryKind::Post && s.entry.flavor == flavor)
            .map(|s| s.entry.credits)
            .sum();
        assert!(dec_eq(
            billed_by_flavor[flavor],
            dec_mul(dec(&format_micros(posted.into())), price_dec)
        ));
        assert_eq!(seconds_by_flavor[flavor], units * 1799);
    }
}

#[test]
fn a_post_without_a_recorded_rate_is_priced_in_credits() {
    let mut p = post();
    p.entry.rate = 0;
    let row = &table(&focus_export("0.5", &[p]))[0];
    assert_eq!(row["PricingUnit"].as_deref(), Some("Credits"));
    assert_eq!(row["PricingQuantity"].as_deref(), Some("32"));
    assert_eq!(row["ListUnitPrice"].as_deref(), Some("0.5"));
    assert_eq!(row["ListCost"].as_deref(), Some("16"));
    assert_eq!(row["BilledCost"].as_deref(), Some("16"));
}

#[test]
fn focus_row() {
    let mut grant = post();
    grant.entry.kind = EntryKind::Grant;
    let mut ex = Exporter::new(
        Vec::new(),
        Format::Focus,
        Pricing::new("EUR", "0.5").unwrap(),
        Parties::new("ACME ML Platform", None, Some("ACME Finance")).unwrap(),
    )
    .unwrap();
    ex.write(&post()).unwrap();
    ex.write(&grant).unwrap();
    assert_eq!(ex.rows(), 1);
    let rows = table(&String::from_utf8(ex.finish().unwrap()).unwrap());
    let get = |c: &str| rows[0][c].as_deref();
    assert_eq!(get("BilledCost"), Some("16"));
    assert_eq!(get("BillingCurrency"), Some("EUR"));
    assert_eq!(get("BillingPeriodStart"), Some("2026-01-01T00:00:00Z"));
    assert_eq!(get("BillingPeriodEnd"), Some("2026-02-01T00:00:00Z"));
    assert_eq!(get("ChargeCategory"), Some("Usage"));
    assert_eq!(get("ChargeClass"), None);
    assert_eq!(get("ListUnitPrice"), Some("2"));
    assert_eq!(get("PricingCurrencyListUnitPrice"), Some("4"));
    assert_eq!(get("PricingQuantity"), Some("8"));
    assert_eq!(get("ListCost"), Some("16"));
    assert_eq!(get("ConsumedQuantity"), Some("28800"));
    assert_eq!(get("ProviderName"), Some("ACME ML Platform"));
    assert_eq!(get("PublisherName"), Some("ACME ML Platform"));
    assert_eq!(get("InvoiceIssuerName"), Some("ACME Finance"));
    assert_eq!(get("ResourceName"), Some("ml/train, \"big\""));
    assert_eq!(get("SkuPriceId"), Some("rc-1/gpu-large/nvidia-h100"));
    assert_eq!(get("x_EvictionReason"), None);
}

#[test]
fn eviction_reason_column_only_for_evicted_settlements() {
    let eviction_of = |reason: &str| {
        let mut p = post();
        p.entry.reason = reason.into();
        table(&focus_export("1", &[p]))[0]["x_EvictionReason"].clone()
    };
    assert_eq!(eviction_of("usage"), None);
    assert_eq!(eviction_of("usage until finished"), None);
    assert_eq!(
        eviction_of("usage until quota released; evicted: Preempted").as_deref(),
        Some("Preempted")
    );
}

#[test]
fn refund_is_a_credit_and_a_correction_of_last_month() {
    let mut c = post();
    c.entry.kind = EntryKind::Correction;
    c.entry.credits = -1_500_000;
    c.entry.created_at = 1_767_225_600 + 40 * 86_400; // February
    let csv = export_all(Format::Focus, Pricing::new("USD", "0.1").unwrap(), &[c]);
    let row = &table(&csv)[0];
    let get = |c: &str| row[c].as_deref();
    assert_eq!(get("BilledCost"), Some("-0.15"));
    assert_eq!(get("ListCost"), Some("-0.15"));
    assert_eq!(get("ChargeCategory"), Some("Credit"));
    assert_eq!(get("ChargeClass"), Some("Correction"));
    assert_eq!(get("ConsumedQuantity"), None);
    assert_eq!(get("ListUnitPrice"), None);
}

#[test]
fn an_unrepresentable_cost_is_an_error_naming_the_entry() {
    let mut p = post();
    p.entry.device_units = u64::MAX / 2;
    p.entry.end = p.entry.start + 366 * 86_400;
    p.entry.rate = 999_999_999_999_999;
    let mut ex = Exporter::new(
        Vec::new(),
        Format::Focus,
        Pricing::new("EUR", "999999999999").unwrap(),
        Parties::default(),
    )
    .unwrap();
    let e = ex.write(&p).unwrap_err().to_string();
    assert!(
        e.contains("entry id 7") && e.contains("--credit-price"),
        "{e}"
    );
}

proptest! {
    /// On every priced usage row ListCost is exactly ListUnitPrice x
    /// PricingQuantity, and it is within the flooring and rounding of BilledCost.
    #[test]
    fn list_cost_is_unit_price_times_quantity(
        units in 0u64..1024, secs in 0i64..400 * 86_400,
        rate in 0u64..10_000_000_000, price in 0u64..10_000_000_000) {
        let mut p = post();
        p.entry.device_units = units;
        p.entry.end = p.entry.start + secs;
        p.entry.rate = rate;
        p.entry.credits = crate::ledger::cumulative(Rate(rate), units, secs as u64).unwrap().0 as i64;
        let price = format_micros(i128::from(price));
        let row = &table(&focus_export(&price, &[p.clone()]))[0];
        let get = |c: &str| dec(row[c].as_deref().unwrap());
        prop_assert!(dec_eq(dec_mul(get("ListUnitPrice"), get("PricingQuantity")), get("ListCost")));
        prop_assert!(dec_eq(dec_mul(get("ContractedUnitPrice"), get("PricingQuantity")), get("ContractedCost")));
        prop_assert!(dec_eq(get("BilledCost"), dec_mul(dec(&format_micros(p.entry.credits.into())), dec(&price))));
    }
}

#[test]
fn a_dra_row_names_its_device_class_and_is_priced_as_the_device_plugin_row() {
    let plugin = post();
    let mut dra = post();
    dra.entry.resource = "dra.kaccel.io/nvidia-h100".into();
    let rows = table(&focus_export("0.5", &[plugin, dra]));
    let tags = |r: &BTreeMap<String, Option<String>>| -> serde_json::Value {
        serde_json::from_str(r["Tags"].as_deref().unwrap()).unwrap()
    };
    assert_eq!(
        tags(&rows[1])["kaccel.io/deviceClass"],
        "nvidia-h100.kaccel.io"
    );
    assert_eq!(
        tags(&rows[1])["kaccel.io/resource"],
        "dra.kaccel.io/nvidia-h100"
    );
    assert!(tags(&rows[0]).get("kaccel.io/deviceClass").is_none());
    let description = rows[1]["ChargeDescription"].as_deref().unwrap();
    assert!(
        description.starts_with("8 x DeviceClass nvidia-h100.kaccel.io (nvidia-h100)"),
        "{description}"
    );
    // Same units, span and rate: the same money, column for column.
    for column in [
        "BilledCost",
        "ListCost",
        "ListUnitPrice",
        "PricingQuantity",
        "ConsumedQuantity",
    ] {
        assert_eq!(rows[0][column], rows[1][column], "{column}");
    }
}

/// What a FOCUS export asks the store for (`Format::narrow`) is exactly what it
/// writes rows for: a kind left out of `kinds_written` would be lost from the
/// export, and one it writes no row for is read for nothing.
#[test]
fn focus_asks_the_store_for_exactly_the_kinds_it_writes() {
    let written = Format::Focus.kinds_written().unwrap();
    for kind in EntryKind::ALL {
        let mut entry = post();
        entry.entry.kind = kind;
        let rows = table(&focus_export("0.5", &[entry]));
        assert_eq!(rows.len(), usize::from(written.contains(&kind)), "{kind:?}");
    }
    let filter = EntryFilter {
        from: Some(T0),
        to: Some(T0 + 3600),
        team: Some("vision".into()),
        device: Some("GPU-1".into()),
        kinds: None,
    };
    let narrowed = Format::Focus.narrow(&filter);
    assert_eq!(narrowed.kinds.as_deref(), Some(written));
    assert_eq!(
        EntryFilter {
            kinds: None,
            ..narrowed
        },
        filter,
        "only the kinds are narrowed"
    );
    // Asked for kinds: only those FOCUS writes stay.
    let asked = EntryFilter {
        kinds: Some(vec![EntryKind::Reserve, EntryKind::Correction]),
        ..EntryFilter::default()
    };
    assert_eq!(
        Format::Focus.narrow(&asked).kinds,
        Some(vec![EntryKind::Correction])
    );
    // The row-per-entry formats read every kind.
    for format in [Format::Csv, Format::Json] {
        assert_eq!(format.narrow(&filter), filter);
    }
}
