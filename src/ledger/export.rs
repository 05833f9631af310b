//! Streaming exports: plain CSV (one row per entry), FOCUS 1.2-shaped CSV and JSON
//! lines. Writers take one entry at a time; nothing is buffered beyond the
//! underlying `Write`.
//!
//! FOCUS mapping. FOCUS is a cost dataset, so only charges become rows: `Post`
//! (ChargeCategory `Usage`) and `Correction` (`Credit` when it refunds, i.e. is
//! negative, `Adjustment` otherwise). Grants, reservations, voids and expiries
//! move no money and are left out (the plain CSV and JSON exports have them).
//! Credits are the pricing currency (`PricingCurrency` = `CREDITS`, a virtual
//! currency, in the `PricingCurrency*` columns); costs are in the billing currency
//! (a real ISO 4217 code) at a configured price per credit, exact decimals. There
//! are no discounts, so ListCost = ContractedCost = EffectiveCost = BilledCost.
//! The billing period is the UTC calendar month of `ChargePeriodStart`.
//! `ChargeClass` is `Correction` for a correction entry written in a later month
//! than the month it corrects (FOCUS: a correction of a previously invoiced
//! billing period); otherwise empty.

use std::io::{self, Write};

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::entry::{EntryKind, format_micros};
use super::store::StoredEntry;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Focus,
    Json,
}

/// Billing currency and price of one credit in it, for FOCUS exports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pricing {
    /// ISO 4217 code, e.g. "EUR".
    pub currency: String,
    /// Price of one credit in the billing currency, in millionths (0.5 → 500000).
    pub micro_price: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(
        "billing currency {0:?} is not an ISO 4217 code (three capital letters, e.g. EUR or USD)"
    )]
    Currency(String),
    #[error("credit price {0:?} is not a non-negative decimal with at most 6 places, e.g. \"0.5\"")]
    Price(String),
    #[error("cannot write the export: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Store(#[from] super::store::StoreError),
}

impl Pricing {
    pub fn new(currency: &str, price: &str) -> Result<Self, ExportError> {
        if currency.len() != 3
            || !currency.bytes().all(|b| b.is_ascii_uppercase())
            || currency == "XXX"
        {
            return Err(ExportError::Currency(currency.into()));
        }
        let micro_price = price
            .parse::<crate::api::Credits>()
            .map_err(|_| ExportError::Price(price.into()))?
            .0;
        Ok(Pricing {
            currency: currency.into(),
            micro_price,
        })
    }
}

/// An RFC 3339 UTC timestamp for unix seconds (saturating to jiff's range).
pub fn rfc3339(secs: i64) -> String {
    Timestamp::from_second(secs)
        .unwrap_or(if secs < 0 {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        })
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The UTC calendar month `[start, end)` containing `secs`.
fn month_of(secs: i64) -> (i64, i64) {
    let Ok(ts) = Timestamp::from_second(secs) else {
        return (secs, secs);
    };
    let date = ts.to_zoned(TimeZone::UTC).date().first_of_month();
    let start = date
        .to_zoned(TimeZone::UTC)
        .map(|z| z.timestamp().as_second())
        .unwrap_or(secs);
    let end = date
        .checked_add(jiff::Span::new().months(1))
        .ok()
        .and_then(|d| d.to_zoned(TimeZone::UTC).ok())
        .map(|z| z.timestamp().as_second())
        .unwrap_or(secs);
    (start, end)
}

/// Exact decimal of `num / 10^scale`, trailing zeros trimmed, signed.
fn decimal(num: i128, scale: u32) -> String {
    let sign = if num < 0 { "-" } else { "" };
    let m = num.unsigned_abs();
    let p = 10u128.pow(scale);
    let (int, frac) = (m / p, m % p);
    if frac == 0 {
        format!("{sign}{int}")
    } else {
        let d = format!("{frac:0width$}", width = scale as usize);
        format!("{sign}{int}.{}", d.trim_end_matches('0'))
    }
}

/// Device-hours of an interval, to the micro-device-hour (floor).
fn device_hours(units: u64, start: i64, end: i64) -> String {
    let secs = i128::from(end.saturating_sub(start).max(0));
    let micro = i128::from(units) * secs * 1_000_000 / 3600;
    decimal(micro, 6)
}

/// Writes one CSV field, quoting when needed (RFC 4180).
fn field(out: &mut impl Write, s: &str) -> io::Result<()> {
    if s.contains([',', '"', '\n', '\r']) || s.starts_with(' ') || s.ends_with(' ') {
        out.write_all(b"\"")?;
        out.write_all(s.replace('"', "\"\"").as_bytes())?;
        out.write_all(b"\"")
    } else {
        out.write_all(s.as_bytes())
    }
}

fn record<S: AsRef<str>>(out: &mut impl Write, fields: &[S]) -> io::Result<()> {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        field(out, f.as_ref())?;
    }
    out.write_all(b"\r\n")
}

pub const CSV_HEADER: [&str; 20] = [
    "id",
    "key",
    "kind",
    "budget",
    "team",
    "namespace",
    "workload",
    "workloadUid",
    "admission",
    "class",
    "flavor",
    "resource",
    "deviceUnits",
    "start",
    "end",
    "credits",
    "rateCard",
    "reason",
    "createdAt",
    "deviceHours",
];

pub const FOCUS_HEADER: [&str; 38] = [
    "BilledCost",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrency",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ResourceId",
    "ResourceName",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
    "x_LedgerEntryId",
    "x_IdempotencyKey",
    "x_Class",
    "x_Flavor",
    "x_EvictionReason",
];

/// A streaming writer for one format.
pub struct Exporter<W: Write> {
    out: W,
    format: Format,
    pricing: Pricing,
    rows: u64,
}

impl<W: Write> Exporter<W> {
    /// Writes the header (CSV formats) and returns the writer.
    pub fn new(mut out: W, format: Format, pricing: Pricing) -> io::Result<Self> {
        match format {
            Format::Csv => record(&mut out, &CSV_HEADER)?,
            Format::Focus => record(&mut out, &FOCUS_HEADER)?,
            Format::Json => {}
        }
        Ok(Exporter {
            out,
            format,
            pricing,
            rows: 0,
        })
    }

    /// Rows written so far (entries skipped by the FOCUS mapping do not count).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn write(&mut self, s: &StoredEntry) -> io::Result<()> {
        match self.format {
            Format::Csv => self.csv(s),
            Format::Focus => self.focus(s),
            Format::Json => {
                let mut v = serde_json::to_value(&s.entry).map_err(io::Error::other)?;
                if let Some(m) = v.as_object_mut() {
                    m.insert("id".into(), s.id.into());
                    // Keep credits exact and readable: decimal string beside micros.
                    m.insert(
                        "creditsDecimal".into(),
                        format_micros(i128::from(s.entry.credits)).into(),
                    );
                }
                serde_json::to_writer(&mut self.out, &v).map_err(io::Error::other)?;
                self.out.write_all(b"\n")?;
                self.rows += 1;
                Ok(())
            }
        }
    }

    fn csv(&mut self, s: &StoredEntry) -> io::Result<()> {
        let e = &s.entry;
        record(
            &mut self.out,
            &[
                s.id.to_string(),
                e.key.clone(),
                e.kind.as_str().to_string(),
                e.budget.clone(),
                e.team.clone(),
                e.namespace.clone(),
                e.workload.clone(),
                e.workload_uid.clone(),
                e.admission.to_string(),
                e.class.clone(),
                e.flavor.clone(),
                e.resource.clone(),
                e.device_units.to_string(),
                rfc3339(e.start),
                rfc3339(e.end),
                format_micros(i128::from(e.credits)),
                e.rate_card.clone(),
                e.reason.clone(),
                rfc3339(e.created_at),
                device_hours(e.device_units, e.start, e.end),
            ],
        )?;
        self.rows += 1;
        Ok(())
    }

    fn focus(&mut self, s: &StoredEntry) -> io::Result<()> {
        let e = &s.entry;
        let category = match e.kind {
            EntryKind::Post => "Usage",
            EntryKind::Correction if e.credits < 0 => "Credit",
            EntryKind::Correction => "Adjustment",
            _ => return Ok(()),
        };
        let (period_start, period_end) = month_of(e.start);
        let (created_month, _) = month_of(e.created_at);
        let class = if e.kind == EntryKind::Correction && period_start < created_month {
            "Correction"
        } else {
            ""
        };
        // credits (micro) × price (micro) = cost in 10^-12 units of the currency.
        let cost = decimal(
            i128::from(e.credits) * i128::from(self.pricing.micro_price),
            12,
        );
        let credits = format_micros(i128::from(e.credits));
        let quantity = device_hours(e.device_units, e.start, e.end);
        // Unit price in credits per device-hour: exact rate needs the rate card;
        // derive it from the entry when the quantity is non-zero, else empty.
        let secs = i128::from(e.end.saturating_sub(e.start).max(0));
        let units = i128::from(e.device_units);
        let (unit_credits, unit_price) = if e.kind == EntryKind::Post && secs > 0 && units > 0 {
            let micro_rate = i128::from(e.credits) * 3600 / (units * secs);
            (
                format_micros(micro_rate),
                decimal(micro_rate * i128::from(self.pricing.micro_price), 12),
            )
        } else {
            (String::new(), String::new())
        };
        let description = match e.kind {
            EntryKind::Post => format!(
                "{} × {} for {} device-hours of workload {}/{} (admission {}) in class {}",
                e.device_units, e.resource, quantity, e.namespace, e.workload, e.admission, e.class
            ),
            _ => format!(
                "Correction of {} credits for workload {}/{} (admission {}): {}",
                credits, e.namespace, e.workload, e.admission, e.reason
            ),
        };
        let tags = serde_json::json!({
            "kaccel.io/budget": e.budget,
            "kaccel.io/namespace": e.namespace,
            "kaccel.io/workload": e.workload,
            "kaccel.io/admission": e.admission.to_string(),
            "kaccel.io/resource": e.resource,
        })
        .to_string();
        // The settlement Post of an evicted admission says why (lifecycle::EVICTED_PREFIX).
        let eviction = match e.kind {
            EntryKind::Post | EntryKind::Correction => e
                .reason
                .split_once(super::lifecycle::EVICTED_PREFIX)
                .map(|(_, why)| why.to_string())
                .unwrap_or_default(),
            _ => String::new(),
        };
        let cur = self.pricing.currency.clone();
        let fields: [String; 38] = [
            cost.clone(),
            cur,
            rfc3339(period_end),
            rfc3339(period_start),
            category.into(),
            class.into(),
            description,
            "Usage-Based".into(),
            rfc3339(e.end),
            rfc3339(e.start),
            quantity.clone(),
            "Device-Hours".into(),
            cost.clone(),
            unit_price.clone(),
            cost.clone(),
            cost,
            unit_price,
            "Standard".into(),
            "CREDITS".into(),
            unit_credits.clone(),
            credits,
            unit_credits,
            quantity,
            "Device-Hours".into(),
            e.workload_uid.clone(),
            format!("{}/{}", e.namespace, e.workload),
            "AI and Machine Learning".into(),
            "kaccel".into(),
            e.flavor.clone(),
            e.rate_card.clone(),
            e.team.clone(),
            e.team.clone(),
            tags,
            s.id.to_string(),
            e.key.clone(),
            e.class.clone(),
            e.flavor.clone(),
            eviction,
        ];
        record(&mut self.out, &fields)?;
        self.rows += 1;
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entry::Entry;

    fn post() -> StoredEntry {
        let mut post = StoredEntry {
            id: 7,
            entry: Entry {
                key: String::new(),
                kind: EntryKind::Post,
                budget: "b".into(),
                team: "vision".into(),
                namespace: "ml".into(),
                workload: "train, \"big\"".into(),
                workload_uid: "uid-1".into(),
                admission: 1,
                class: "gpu-large".into(),
                flavor: "nvidia-h100".into(),
                resource: "nvidia.com/gpu".into(),
                device_units: 8,
                start: 1_767_225_600, // 2026-01-01T00:00:00Z
                end: 1_767_229_200,
                credits: 32_000_000,
                rate_card: "rc-1".into(),
                reason: String::new(),
                created_at: 1_767_229_200,
                rate: 4_000_000,
            },
        };
        post.entry.key = post.entry.derived_key().unwrap();
        post
    }

    #[test]
    fn csv_quotes_and_formats() {
        let mut ex =
            Exporter::new(Vec::new(), Format::Csv, Pricing::new("EUR", "1").unwrap()).unwrap();
        ex.write(&post()).unwrap();
        let s = String::from_utf8(ex.finish().unwrap()).unwrap();
        let line = s.lines().nth(1).unwrap();
        assert!(line.contains("\"train, \"\"big\"\"\""), "{line}");
        assert!(line.contains("2026-01-01T00:00:00Z"));
        assert!(line.contains(",32,"));
        assert!(line.ends_with(",8"));
    }

    #[test]
    fn focus_row() {
        let mut ex = Exporter::new(
            Vec::new(),
            Format::Focus,
            Pricing::new("EUR", "0.5").unwrap(),
        )
        .unwrap();
        ex.write(&post()).unwrap();
        let mut grant = post();
        grant.entry.kind = EntryKind::Grant;
        ex.write(&grant).unwrap();
        assert_eq!(ex.rows(), 1);
        let s = String::from_utf8(ex.finish().unwrap()).unwrap();
        let header: Vec<&str> = s.lines().next().unwrap().split(',').collect();
        let row = s.lines().nth(1).unwrap();
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let fields: Vec<&str> = row.split(',').collect();
        // The workload name is quoted and has a comma: count from the front only.
        assert_eq!(fields[col("BilledCost")], "16");
        assert_eq!(fields[col("BillingCurrency")], "EUR");
        assert_eq!(fields[col("BillingPeriodStart")], "2026-01-01T00:00:00Z");
        assert_eq!(fields[col("BillingPeriodEnd")], "2026-02-01T00:00:00Z");
        assert_eq!(fields[col("ChargeCategory")], "Usage");
        assert!(
            row.contains(",CREDITS,4,32,4,8,Device-Hours,uid-1,"),
            "{row}"
        );
        assert!(row.contains("AI and Machine Learning,kaccel,nvidia-h100,rc-1,vision"));
    }

    #[test]
    fn eviction_reason_column_only_for_evicted_settlements() {
        let eviction_of = |reason: &str| {
            let mut p = post();
            p.entry.reason = reason.into();
            let mut ex =
                Exporter::new(Vec::new(), Format::Focus, Pricing::new("EUR", "1").unwrap())
                    .unwrap();
            ex.write(&p).unwrap();
            let s = String::from_utf8(ex.finish().unwrap()).unwrap();
            let header: Vec<&str> = s.lines().next().unwrap().split(',').collect();
            let last = header.len() - 1;
            assert_eq!(header[last], "x_EvictionReason");
            s.lines()
                .nth(1)
                .unwrap()
                .rsplit(',')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(eviction_of("usage"), "");
        assert_eq!(eviction_of("usage until finished"), "");
        assert_eq!(
            eviction_of("usage until quota released; evicted: Preempted"),
            "Preempted"
        );
    }

    #[test]
    fn refund_is_a_credit_and_a_correction_of_last_month() {
        let mut c = post();
        c.entry.kind = EntryKind::Correction;
        c.entry.credits = -1_500_000;
        c.entry.created_at = 1_767_225_600 + 40 * 86_400; // February
        let mut ex = Exporter::new(
            Vec::new(),
            Format::Focus,
            Pricing::new("USD", "0.1").unwrap(),
        )
        .unwrap();
        ex.write(&c).unwrap();
        let s = String::from_utf8(ex.finish().unwrap()).unwrap();
        let row = s.lines().nth(1).unwrap();
        assert!(row.starts_with("-0.15,USD,"), "{row}");
        assert!(row.contains(",Credit,Correction,"), "{row}");
    }

    #[test]
    fn rejects_bad_pricing() {
        assert!(Pricing::new("eur", "1").is_err());
        assert!(Pricing::new("CREDITS", "1").is_err());
        assert!(Pricing::new("EUR", "-1").is_err());
        assert_eq!(Pricing::new("EUR", "0.5").unwrap().micro_price, 500_000);
    }

    #[test]
    fn decimals_are_exact() {
        assert_eq!(decimal(1, 12), "0.000000000001");
        assert_eq!(decimal(-2_500_000_000_000, 12), "-2.5");
        assert_eq!(device_hours(1, 0, 1), "0.000277");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    }
}
