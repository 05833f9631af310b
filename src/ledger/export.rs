//! Streaming exports: plain CSV (one row per entry), FOCUS 1.2 CSV and JSON lines.
//! Writers take one entry at a time; nothing is buffered beyond the underlying
//! `Write`.
//!
//! **Plain CSV.** `credits` is the entry's amount as recorded: non-negative, signed
//! only for `Correction`; what it does depends on `kind`, so summing it across
//! kinds double-counts (a Reserve and its Post both carry the amount). The signed
//! `grantedDelta`, `reservedDelta`, `spentDelta` and `remainingDelta` columns are
//! each entry's effect on its budget's balances ([`Balances::apply`], the rule the
//! stores and `verify` use): summed over all of a budget's rows they equal its
//! granted, reserved, spent and remaining credits.
//!
//! **FOCUS 1.2** (checked column by column against the FinOps FOCUS_Spec
//! repository at tag v1.2, `specification/columns/*.md` and
//! `specification/attributes/*.md`). FOCUS is a cost dataset, so only charges
//! become rows: `Post` (ChargeCategory `Usage`) and `Correction` (`Credit` when it
//! refunds, i.e. is negative, `Adjustment` otherwise). Grants and expiries are
//! allowances, reservations and voids are holds: none is a charge, and they are
//! left out (the plain CSV and JSON exports have them).
//!
//! - Parties (mandatory, non-null): ProviderName, PublisherName and
//!   InvoiceIssuerName come from [`Parties`] (`--provider`, default `kaccel`, the
//!   platform; publisher and invoice issuer default to the provider).
//!   BillingAccountId/Name is the team (who pays; the budget when an entry has no
//!   team), SubAccountId/Name the CreditBudget.
//! - Currencies: credits are the pricing currency (`PricingCurrency` = `CREDITS`, a
//!   virtual currency, CurrencyFormat); costs are in the billing currency (an ISO
//!   4217 code) at a configured price per credit.
//! - Usage rows: ListUnitPrice = ContractedUnitPrice = the entry's recorded rate
//!   (credits per device-hour, `Entry::rate`) x the credit price, exact;
//!   PricingQuantity = device-hours = units x seconds / 3600 rounded half-up to 6
//!   decimals (PricingUnit `Device-Hours`); ListCost = ContractedCost =
//!   ListUnitPrice x PricingQuantity computed exactly (listcost.md: "The product of
//!   ListUnitPrice and PricingQuantity MUST match the ListCost"). BilledCost =
//!   EffectiveCost = the credits the ledger charged x the credit price, exact. The
//!   two differ by the ledger's flooring (under one micro-credit per entry) and the
//!   quantity rounding (at most half a micro-device-hour x the rate); BilledCost is
//!   what budgets are charged and what sums to the ledger's `spent`.
//!   ConsumedQuantity is the exact integer of device-seconds (ConsumedUnit
//!   `Device-Seconds`), Kueue's admitted units x admitted seconds.
//! - Rows written before ledger schema version 3 carry no rate (`rate` = 0). A Post
//!   with credits but no rate is priced in credits: PricingUnit `Credits`,
//!   PricingQuantity = the credits, unit price = the credit price, so the product
//!   rule still holds exactly and ListCost = BilledCost; no rate is guessed.
//! - Corrections are not usage: ConsumedQuantity/Unit are null (consumedquantity.md),
//!   unit prices, PricingQuantity/Unit and PricingCategory are null (allowed for
//!   Credit and Adjustment), and ListCost = ContractedCost = BilledCost (listcost.md:
//!   a charge unrelated to other charges with a null unit price).
//! - No discounts, one pricing model: PricingCategory `Standard`, ChargeFrequency
//!   `Usage-Based`, ServiceCategory `AI and Machine Learning` / ServiceSubcategory
//!   `AI Platforms`.
//! - The billing period is the UTC calendar month of `ChargePeriodStart`.
//!   `ChargeClass` is `Correction` for a correction entry written in a later month
//!   than the month it corrects (a correction of a previously invoiced billing
//!   period); otherwise null.
//! - NULL is an empty, unquoted CSV field; no non-null value is ever empty.
//!   Date/times are `YYYY-MM-DDTHH:mm:ssZ`; numbers are plain decimals without `+`.
//!   Custom columns (`x_`) come after the FOCUS columns.

use std::io::{self, Write};

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::entry::{Balances, EntryKind, format_micros};
use super::store::{EntryFilter, LedgerStore, StoredEntry, for_each_entry};

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

/// Who provides, publishes and invoices the devices, for FOCUS's mandatory
/// ProviderName, PublisherName and InvoiceIssuerName.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parties {
    pub provider: String,
    pub publisher: String,
    pub invoice_issuer: String,
}

/// The provider's default name: the platform itself.
pub const DEFAULT_PROVIDER: &str = "kaccel";

impl Default for Parties {
    fn default() -> Self {
        Parties {
            provider: DEFAULT_PROVIDER.into(),
            publisher: DEFAULT_PROVIDER.into(),
            invoice_issuer: DEFAULT_PROVIDER.into(),
        }
    }
}

impl Parties {
    /// The publisher and invoice issuer default to the provider.
    pub fn new(
        provider: &str,
        publisher: Option<&str>,
        invoice_issuer: Option<&str>,
    ) -> Result<Self, ExportError> {
        let check = |flag: &'static str, value: &str| {
            if value.trim().is_empty() || value.chars().any(char::is_control) {
                Err(ExportError::Party {
                    flag,
                    value: value.into(),
                })
            } else {
                Ok(value.to_string())
            }
        };
        Ok(Parties {
            provider: check("--provider", provider)?,
            publisher: check("--publisher", publisher.unwrap_or(provider))?,
            invoice_issuer: check("--invoice-issuer", invoice_issuer.unwrap_or(provider))?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(
        "billing currency {0:?} is not an ISO 4217 code (three capital letters, e.g. EUR or USD)"
    )]
    Currency(String),
    #[error("credit price {0:?} is not a non-negative decimal with at most 6 places, e.g. \"0.5\"")]
    Price(String),
    #[error(
        "{flag} {value:?} is not a usable FOCUS name: give a non-empty name without control characters, e.g. {flag} \"ML Platform\""
    )]
    Party { flag: &'static str, value: String },
    #[error(
        "ledger entry id {id} ({key}): its FOCUS {column} does not fit 128-bit decimal arithmetic; export with a smaller --credit-price"
    )]
    Overflow {
        id: i64,
        key: String,
        column: &'static str,
    },
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

pub use crate::k8s::time::rfc3339;

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

/// An exact decimal `units / 10^scale`: products of these are exact, so a cost
/// printed from one is exactly the product of the printed factors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fixed {
    units: i128,
    scale: u32,
}

impl Fixed {
    fn micros(units: impl Into<i128>) -> Fixed {
        Fixed {
            units: units.into(),
            scale: 6,
        }
    }

    fn checked_mul(self, other: Fixed) -> Option<Fixed> {
        Some(Fixed {
            units: self.units.checked_mul(other.units)?,
            scale: self.scale + other.scale,
        })
    }
}

impl std::fmt::Display for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&decimal(self.units, self.scale))
    }
}

/// Device-seconds of an interval (exact).
fn device_seconds(units: u64, start: i64, end: i64) -> i128 {
    i128::from(units) * i128::from(end.saturating_sub(start).max(0))
}

/// Micro-device-hours of an interval, rounded half-up (device-seconds x 10^6 /
/// 3600, non-negative).
fn micro_device_hours(units: u64, start: i64, end: i64) -> i128 {
    (device_seconds(units, start, end) * 1_000_000 + 1800) / 3600
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

pub const CSV_HEADER: [&str; 25] = [
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
    "ratePerDeviceHour",
    "grantedDelta",
    "reservedDelta",
    "spentDelta",
    "remainingDelta",
];

/// The FOCUS columns in the order written: FOCUS 1.2 columns alphabetically, then
/// kaccel's `x_` columns.
pub const FOCUS_HEADER: [&str; 47] = [
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
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
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrency",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
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

/// How a usage row is priced.
struct UsagePrice {
    /// Unit price in credits (PricingCurrency*UnitPrice).
    unit_credits: Fixed,
    quantity: Fixed,
    unit: &'static str,
}

/// A streaming writer for one format.
pub struct Exporter<W: Write> {
    out: W,
    format: Format,
    pricing: Pricing,
    parties: Parties,
    rows: u64,
}

impl<W: Write> Exporter<W> {
    /// Writes the header (CSV formats) and returns the writer.
    pub fn new(mut out: W, format: Format, pricing: Pricing, parties: Parties) -> io::Result<Self> {
        match format {
            Format::Csv => record(&mut out, &CSV_HEADER)?,
            Format::Focus => record(&mut out, &FOCUS_HEADER)?,
            Format::Json => {}
        }
        Ok(Exporter {
            out,
            format,
            pricing,
            parties,
            rows: 0,
        })
    }

    /// Rows written so far (entries skipped by the FOCUS mapping do not count).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn write(&mut self, s: &StoredEntry) -> Result<(), ExportError> {
        match self.format {
            Format::Csv => self.csv(s)?,
            Format::Focus => self.focus(s)?,
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
            }
        }
        Ok(())
    }

    fn csv(&mut self, s: &StoredEntry) -> io::Result<()> {
        let e = &s.entry;
        // The entry's signed effect on its budget, by the one rule balances use.
        let mut delta = Balances::default();
        delta.apply(e.kind, e.credits);
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
                decimal(micro_device_hours(e.device_units, e.start, e.end), 6),
                format_micros(i128::from(e.rate)),
                format_micros(delta.granted),
                format_micros(delta.reserved),
                format_micros(delta.spent),
                format_micros(delta.remaining()),
            ],
        )?;
        self.rows += 1;
        Ok(())
    }

    /// The pricing of a usage row: the recorded rate per device-hour, or, for a
    /// row written before rates were recorded that was charged something, the
    /// credits themselves (see the module documentation).
    fn usage_price(s: &StoredEntry) -> UsagePrice {
        let e = &s.entry;
        if e.rate == 0 && e.credits > 0 {
            UsagePrice {
                unit_credits: Fixed::micros(1_000_000),
                quantity: Fixed::micros(e.credits),
                unit: "Credits",
            }
        } else {
            UsagePrice {
                unit_credits: Fixed::micros(e.rate),
                quantity: Fixed::micros(micro_device_hours(e.device_units, e.start, e.end)),
                unit: "Device-Hours",
            }
        }
    }

    fn focus(&mut self, s: &StoredEntry) -> Result<(), ExportError> {
        let e = &s.entry;
        let category = match e.kind {
            EntryKind::Post => "Usage",
            EntryKind::Correction if e.credits < 0 => "Credit",
            EntryKind::Correction => "Adjustment",
            _ => return Ok(()),
        };
        let usage = e.kind == EntryKind::Post;
        let overflow = |column| ExportError::Overflow {
            id: s.id,
            key: e.key.clone(),
            column,
        };
        let (period_start, period_end) = month_of(e.start);
        let (created_month, _) = month_of(e.created_at);
        let class = (e.kind == EntryKind::Correction && period_start < created_month)
            .then(|| "Correction".to_string());
        let price = Fixed::micros(self.pricing.micro_price);
        let credits = Fixed::micros(e.credits);
        let billed = credits
            .checked_mul(price)
            .ok_or_else(|| overflow("BilledCost"))?;
        let priced = usage.then(|| Self::usage_price(s));
        // (unit price in the billing currency, list cost = unit price x quantity)
        let (unit_price, list_cost) = match &priced {
            Some(p) => {
                let unit = p
                    .unit_credits
                    .checked_mul(price)
                    .ok_or_else(|| overflow("ListUnitPrice"))?;
                let cost = unit
                    .checked_mul(p.quantity)
                    .ok_or_else(|| overflow("ListCost"))?;
                (Some(unit.to_string()), cost.to_string())
            }
            None => (None, billed.to_string()),
        };
        let unit_credits = priced.as_ref().map(|p| p.unit_credits.to_string());
        let device_secs = device_seconds(e.device_units, e.start, e.end);
        let description = if usage {
            format!(
                "{} x {} ({}) for {} device-seconds at {} credits per device-hour, workload {}/{} (admission {}) in class {}",
                e.device_units,
                e.resource,
                e.flavor,
                device_secs,
                format_micros(i128::from(e.rate)),
                e.namespace,
                e.workload,
                e.admission,
                e.class
            )
        } else {
            format!(
                "Correction of {credits} credits for workload {}/{} (admission {}): {}",
                e.namespace, e.workload, e.admission, e.reason
            )
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
        let eviction = e
            .reason
            .split_once(super::lifecycle::EVICTED_PREFIX)
            .map(|(_, why)| why.to_string());
        let account = if e.team.is_empty() {
            &e.budget
        } else {
            &e.team
        };
        let some = |v: &str| Some(v.to_string());
        let non_empty = |v: &str| (!v.is_empty()).then(|| v.to_string());
        let sku_price = format!("{}/{}/{}", e.rate_card, e.class, e.flavor);
        let columns: [(&str, Option<String>); 47] = [
            ("BilledCost", Some(billed.to_string())),
            ("BillingAccountId", some(account)),
            ("BillingAccountName", some(account)),
            ("BillingCurrency", some(&self.pricing.currency)),
            ("BillingPeriodEnd", Some(rfc3339(period_end))),
            ("BillingPeriodStart", Some(rfc3339(period_start))),
            ("ChargeCategory", some(category)),
            ("ChargeClass", class),
            ("ChargeDescription", Some(description)),
            ("ChargeFrequency", some("Usage-Based")),
            ("ChargePeriodEnd", Some(rfc3339(e.end))),
            ("ChargePeriodStart", Some(rfc3339(e.start))),
            ("ConsumedQuantity", usage.then(|| device_secs.to_string())),
            ("ConsumedUnit", usage.then(|| "Device-Seconds".to_string())),
            ("ContractedCost", Some(list_cost.clone())),
            ("ContractedUnitPrice", unit_price.clone()),
            ("EffectiveCost", Some(billed.to_string())),
            ("InvoiceIssuerName", some(&self.parties.invoice_issuer)),
            ("ListCost", Some(list_cost)),
            ("ListUnitPrice", unit_price),
            ("PricingCategory", usage.then(|| "Standard".to_string())),
            ("PricingCurrency", some("CREDITS")),
            ("PricingCurrencyContractedUnitPrice", unit_credits.clone()),
            ("PricingCurrencyEffectiveCost", Some(credits.to_string())),
            ("PricingCurrencyListUnitPrice", unit_credits),
            (
                "PricingQuantity",
                priced.as_ref().map(|p| p.quantity.to_string()),
            ),
            ("PricingUnit", priced.as_ref().map(|p| p.unit.to_string())),
            ("ProviderName", some(&self.parties.provider)),
            ("PublisherName", some(&self.parties.publisher)),
            ("ResourceId", non_empty(&e.workload_uid)),
            (
                "ResourceName",
                (!e.workload_uid.is_empty()).then(|| format!("{}/{}", e.namespace, e.workload)),
            ),
            (
                "ResourceType",
                (!e.workload_uid.is_empty()).then(|| "Kueue Workload".to_string()),
            ),
            ("ServiceCategory", some("AI and Machine Learning")),
            ("ServiceName", some("kaccel")),
            ("ServiceSubcategory", some("AI Platforms")),
            ("SkuId", non_empty(&e.flavor)),
            (
                "SkuMeter",
                (!e.flavor.is_empty()).then(|| "Accelerator Time".to_string()),
            ),
            ("SkuPriceDetails", None),
            ("SkuPriceId", (!e.flavor.is_empty()).then_some(sku_price)),
            ("SubAccountId", some(&e.budget)),
            ("SubAccountName", some(&e.budget)),
            ("Tags", Some(tags)),
            ("x_LedgerEntryId", Some(s.id.to_string())),
            ("x_IdempotencyKey", some(&e.key)),
            ("x_Class", non_empty(&e.class)),
            ("x_Flavor", non_empty(&e.flavor)),
            ("x_EvictionReason", eviction),
        ];
        debug_assert!(
            columns
                .iter()
                .map(|(name, _)| *name)
                .eq(FOCUS_HEADER.iter().copied())
        );
        let fields = columns.map(|(_, v)| v.unwrap_or_default());
        record(&mut self.out, &fields)?;
        self.rows += 1;
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Streams the matching entries into `out` in `format`; returns the rows written.
/// (`kaccel ledger export`, src/cli/ledger.rs, maps its `--format` onto this.)
pub async fn export_entries<S: LedgerStore, W: Write>(
    store: &S,
    filter: &EntryFilter,
    format: Format,
    pricing: Pricing,
    parties: Parties,
    out: W,
) -> Result<u64, String> {
    let mut ex = Exporter::new(out, format, pricing, parties).map_err(|e| e.to_string())?;
    for_each_entry(store, filter, |e| ex.write(e))
        .await
        .map_err(|e| e.to_string())?;
    let rows = ex.rows();
    ex.finish().map_err(|e| e.to_string())?;
    Ok(rows)
}

// Reading an export back, for checks (tests, the e2e suite, finance scripts).

/// Parses RFC 4180 CSV as written here: an empty unquoted field is NULL (None).
pub fn read_csv(csv: &str) -> Vec<Vec<Option<String>>> {
    let mut rows = Vec::new();
    let (mut row, mut cur, mut quoted, mut was_quoted) = (Vec::new(), String::new(), false, false);
    let mut chars = csv.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cur.push(c),
            (false, '"') => (quoted, was_quoted) = (true, true),
            (false, ',' | '\n') => {
                let v = std::mem::take(&mut cur);
                row.push((was_quoted || !v.is_empty()).then_some(v));
                was_quoted = false;
                if c == '\n' {
                    rows.push(std::mem::take(&mut row));
                }
            }
            (false, '\r') => {}
            (false, c) => cur.push(c),
        }
    }
    rows
}

/// The rows of a CSV export as column name -> value (None: NULL); None when a
/// row is not as wide as the header.
pub fn read_csv_table(
    csv: &str,
) -> Option<Vec<std::collections::BTreeMap<String, Option<String>>>> {
    let mut rows = read_csv(csv).into_iter();
    let header: Vec<String> = rows
        .next()?
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
    rows.map(|r| (r.len() == header.len()).then(|| header.iter().cloned().zip(r).collect()))
        .collect()
}

/// An exported number (NumericFormat: optional `-`, digits, optional fraction)
/// as the exact `(units, scale)` of `units / 10^scale`.
pub fn parse_decimal(s: &str) -> Option<(i128, u32)> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let (neg, int) = match int.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, int),
    };
    let digits = format!("{int}{frac}");
    if int.is_empty()
        || (s.contains('.') && frac.is_empty())
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let v: i128 = digits.parse().ok()?;
    Some((if neg { -v } else { v }, u32::try_from(frac.len()).ok()?))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::api::Credits;
    use crate::ledger::admission::{FlavorUsage, RateInfo, ReservationLine};
    use crate::ledger::charge::{Charge, ChargeOwner, ChargeState, Renewal, RenewalRule};
    use crate::ledger::conformance::grant_like;
    use crate::ledger::entry::{Entry, expiry_key};
    use crate::ledger::lifecycle::Ended;
    use crate::ledger::pricing::Rate;

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

    fn table(csv: &str) -> Vec<BTreeMap<String, Option<String>>> {
        read_csv_table(csv).expect("a header and rows as wide as it")
    }

    fn parse_csv(csv: &str) -> Vec<Vec<Option<String>>> {
        read_csv(csv)
    }

    fn dec(s: &str) -> (i128, u32) {
        parse_decimal(s).unwrap_or_else(|| panic!("not a FOCUS number: {s:?}"))
    }

    fn dec_eq(a: (i128, u32), b: (i128, u32)) -> bool {
        let s = a.1.max(b.1);
        a.0 * 10i128.pow(s - a.1) == b.0 * 10i128.pow(s - b.1)
    }

    fn dec_mul(a: (i128, u32), b: (i128, u32)) -> (i128, u32) {
        (a.0 * b.0, a.1 + b.1)
    }

    fn stored(entries: &[Entry]) -> Vec<StoredEntry> {
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| StoredEntry {
                id: i as i64 + 1,
                entry: e.clone(),
            })
            .collect()
    }

    fn export_all(format: Format, pricing: Pricing, entries: &[StoredEntry]) -> String {
        let mut ex = Exporter::new(Vec::new(), format, pricing, Parties::default()).unwrap();
        for e in entries {
            ex.write(e).unwrap();
        }
        String::from_utf8(ex.finish().unwrap()).unwrap()
    }

    fn focus_export(pricing: &str, entries: &[StoredEntry]) -> String {
        export_all(
            Format::Focus,
            Pricing::new("EUR", pricing).unwrap(),
            entries,
        )
    }

    const T0: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

    fn line(flavor: &str, resource: &str, units: u64, rate: u64) -> ReservationLine {
        ReservationLine {
            usage: FlavorUsage {
                flavor: flavor.into(),
                resource: resource.into(),
                device_units: units,
            },
            rate: RateInfo {
                class: "train".into(),
                model: format!("model-{flavor}"),
                rate: Rate(rate),
                rate_card: "rc-7f3a".into(),
            },
            credits: Credits(0),
        }
    }

    /// One admission of two lines at different, awkward rates charged by the real
    /// charging code: reserved, renewed term by term, posted every 61 s and settled
    /// after 1799 s by a platform preemption (refunded).
    fn charged_run(budget: &str, team: &str, uid: &str) -> Vec<Entry> {
        let c = Charge {
            owner: ChargeOwner {
                budget: budget.into(),
                team: team.into(),
                namespace: format!("ns-{team}"),
                workload: format!("job-{uid}"),
                workload_uid: uid.into(),
                admission: 1,
            },
            admitted_at: T0 + 17,
            term_seconds: 600,
            lines: vec![
                line("nvidia-h100", "nvidia.com/gpu", 2, 3_333_333),
                line("mig-1g", "nvidia.com/mig-1g.10gb", 7, 250_001),
            ],
        };
        let rich = Balances {
            granted: 1 << 80,
            ..Default::default()
        };
        let mut all = c.reserve_terms(0, 1, "reserve", c.admitted_at);
        let mut state = ChargeState::of(&c, &all);
        let end = c.admitted_at + 1799;
        for now in (c.admitted_at..end).step_by(45) {
            if now >= c.renewal_due_at(state.terms)
                && let Renewal::Renew { entries, .. } =
                    c.decide_renewal(state.terms, &rich, RenewalRule::default(), now)
            {
                state.apply(&c, &entries);
                all.extend(entries);
            }
            let (posts, _) = c.due_posts(&state, now, 61);
            state.apply(&c, &posts);
            all.extend(posts);
        }
        let ended = Ended {
            at: end,
            platform_preempted: true,
            reason: "quota released; evicted: Preempted".into(),
        };
        all.extend(c.settle(&state, &ended, end));
        let state = ChargeState::of(&c, &all);
        all.extend(c.preemption_refunds(&state.posted, &ended));
        for e in &all {
            e.validate().unwrap();
        }
        assert!(all.iter().filter(|e| e.kind == EntryKind::Reserve).count() >= 6);
        all
    }

    /// A run, its budget's grant, a pre-version-3 Post without a rate, and a
    /// refund written in the next month (a correction of an invoiced period).
    fn ledger() -> Vec<Entry> {
        let mut all = charged_run("vision-q1", "vision", "u-1");
        all.insert(0, grant_like(&all[0], 5_000_000_000));
        let mut legacy = all
            .iter()
            .find(|e| e.kind == EntryKind::Post && e.flavor == "nvidia-h100")
            .unwrap()
            .clone();
        legacy.workload_uid = "u-legacy".into();
        legacy.rate = 0;
        legacy.key = legacy.derived_key().unwrap();
        all.push(legacy);
        let refund = all
            .iter_mut()
            .find(|e| e.kind == EntryKind::Correction)
            .unwrap();
        refund.created_at = T0 + 40 * 86_400;
        all
    }

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
                get("PricingCategory").is_none_or(|v| [
                    "Standard",
                    "Dynamic",
                    "Committed",
                    "Other"
                ]
                .contains(&v))
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
                    let gap =
                        (i128::from(e.rate) * micro_dh - i128::from(e.credits) * 1_000_000).abs();
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

    #[tokio::test]
    async fn csv_delta_columns_sum_to_the_store_balances() {
        use crate::ledger::store::{LedgerStore, SqliteStore};
        let mut entries = ledger();
        // A second budget with an expired grant and a run still open (reserved).
        let mut open = charged_run("nlp-q1", "nlp", "u-2");
        open.retain(|e| matches!(e.kind, EntryKind::Reserve | EntryKind::Post));
        let grant = grant_like(&open[0], 900_000_000);
        let expiry = Entry {
            key: expiry_key("nlp-q1", grant.start),
            kind: EntryKind::Expiry,
            credits: 100_000_000,
            ..grant.clone()
        };
        entries.extend([grant, expiry]);
        entries.extend(open);
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("ledger.db"))
            .await
            .unwrap();
        store.append(&entries).await.unwrap();
        let mut out = Vec::new();
        export_entries(
            &store,
            &EntryFilter::default(),
            Format::Csv,
            Pricing::new("EUR", "1").unwrap(),
            Parties::default(),
            &mut out,
        )
        .await
        .unwrap();
        let rows = table(&String::from_utf8(out).unwrap());
        assert_eq!(rows.len(), entries.len());
        for budget in ["vision-q1", "nlp-q1"] {
            let want = store.balances(budget).await.unwrap();
            assert!(want.reserved != 0 || budget == "vision-q1");
            let sum = |col: &str| -> i128 {
                rows.iter()
                    .filter(|r| r["budget"].as_deref() == Some(budget))
                    .map(|r| {
                        let (v, scale) = dec(r[col].as_deref().unwrap());
                        v * 10i128.pow(6 - scale)
                    })
                    .sum()
            };
            assert_eq!(sum("grantedDelta"), want.granted, "{budget}");
            assert_eq!(sum("reservedDelta"), want.reserved, "{budget}");
            assert_eq!(sum("spentDelta"), want.spent, "{budget}");
            assert_eq!(sum("remainingDelta"), want.remaining(), "{budget}");
        }
    }

    #[test]
    fn csv_quotes_and_formats() {
        let csv = export_all(Format::Csv, Pricing::new("EUR", "1").unwrap(), &[post()]);
        let line = csv.lines().nth(1).unwrap();
        assert!(line.contains("\"train, \"\"big\"\"\""), "{line}");
        assert!(line.contains("2026-01-01T00:00:00Z"));
        assert!(line.contains(",32,"));
        // 8 device-hours at 4 credits: spent +32, reserved -32.
        assert!(line.ends_with(",8,4,0,-32,32,0"), "{line}");
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
    fn rejects_bad_pricing_and_names() {
        assert!(Pricing::new("eur", "1").is_err());
        assert!(Pricing::new("CREDITS", "1").is_err());
        assert!(Pricing::new("EUR", "-1").is_err());
        assert_eq!(Pricing::new("EUR", "0.5").unwrap().micro_price, 500_000);
        let e = Parties::new(" ", None, None).unwrap_err().to_string();
        assert!(e.contains("--provider"), "{e}");
        let e = Parties::new("p", Some("a\nb"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--publisher"), "{e}");
        assert_eq!(Parties::new("p", None, None).unwrap().invoice_issuer, "p");
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

    #[test]
    fn decimals_are_exact() {
        assert_eq!(decimal(1, 12), "0.000000000001");
        assert_eq!(decimal(-2_500_000_000_000, 12), "-2.5");
        // 1 device-second = 0.000277(7) device-hours: rounded, not truncated.
        assert_eq!(micro_device_hours(1, 0, 1), 278);
        assert_eq!(micro_device_hours(1, 0, 9), 2500);
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse_decimal("-0.150"), Some((-150, 3)));
        for bad in ["", "+1", "1.", ".5", "1e5", "1,5", "-"] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
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
}
