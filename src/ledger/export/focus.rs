//! The FOCUS 1.2 export: one cost row per charge (a Post or a Correction).
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
//!   InvoiceIssuerName come from [`Parties`](super::Parties) (`--provider`,
//!   default `kaccel`, the platform; publisher and invoice issuer default to the
//!   provider).
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

use std::io::Write;

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::csv::{Fields, push_joined};
use super::numbers::{Fixed, device_seconds};
use super::{ExportError, Exporter};
use crate::k8s::time::push_rfc3339;
use crate::ledger::decimal::{push_decimal, push_int};
use crate::ledger::entry::{Entry, EntryKind};
use crate::ledger::store::StoredEntry;

/// A row's billing period, the UTC calendar month `[start, end)`, with its
/// bounds as RFC 3339 text: the same for most rows of an export, so the
/// exporter keeps the last one and writes its text without formatting it
/// twice a row.
pub(super) struct BillingMonth {
    start: i64,
    end: i64,
    start_text: String,
    end_text: String,
}

impl BillingMonth {
    fn containing(secs: i64) -> BillingMonth {
        let (start, end) = compute_month_of(secs);
        let text = |secs| {
            let mut text = String::with_capacity(20);
            push_rfc3339(&mut text, secs);
            text
        };
        BillingMonth {
            start,
            end,
            start_text: text(start),
            end_text: text(end),
        }
    }

    fn contains(&self, secs: i64) -> bool {
        self.start <= secs && secs < self.end
    }
}

/// The UTC calendar month `[start, end)` containing `secs`.
fn compute_month_of(secs: i64) -> (i64, i64) {
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

/// The FOCUS columns in the order written: FOCUS 1.2 columns alphabetically, then
/// kaccel's `x_` columns.
pub const FOCUS_HEADER: [&str; 49] = [
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
    "x_Devices",
    "x_Cluster",
];

/// Appends `v` as a JSON string (quoted, escaped per RFC 8259).
fn push_json_string(out: &mut String, v: &str) {
    out.push('"');
    // Most values (names, UIDs) need no escape: one copy.
    if !v.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(v);
        out.push('"');
        return;
    }
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// How a usage row is priced.
struct UsagePrice {
    /// Unit price in credits (PricingCurrency*UnitPrice).
    unit_credits: Fixed,
    quantity: Fixed,
    unit: &'static str,
}

impl<W: Write> Exporter<W> {
    /// The pricing of a usage row: the recorded rate per device-hour, or, for a
    /// row written before rates were recorded that was charged something, the
    /// credits themselves (see the module documentation).
    fn usage_price(s: &StoredEntry) -> Result<UsagePrice, ExportError> {
        let e = &s.entry;
        Ok(if e.rate == 0 && e.credits > 0 {
            UsagePrice {
                unit_credits: Fixed::micros(1_000_000),
                quantity: Fixed::micros(e.credits),
                unit: "Credits",
            }
        } else {
            UsagePrice {
                unit_credits: Fixed::micros(e.rate),
                quantity: Fixed::micros(super::entry_micro_device_hours(s)?),
                unit: "Device-Hours",
            }
        })
    }

    pub(super) fn focus(&mut self, s: &StoredEntry) -> Result<(), ExportError> {
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
        let billing_month = match &mut self.billing_month {
            Some(month) if month.contains(e.start) => month,
            slot => slot.insert(BillingMonth::containing(e.start)),
        };
        let period_start = billing_month.start;
        let class = (e.kind == EntryKind::Correction
            && period_start < compute_month_of(e.created_at).0)
            .then_some("Correction");
        let price = Fixed::micros(self.pricing.micro_price);
        let credits = Fixed::micros(e.credits);
        let billed = credits
            .checked_mul(price)
            .ok_or_else(|| overflow("BilledCost"))?;
        let priced = usage.then(|| Self::usage_price(s)).transpose()?;
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
                (Some(unit), cost)
            }
            None => (None, billed),
        };
        let unit_credits = priced.as_ref().map(|p| p.unit_credits);
        let device_secs = device_seconds(e.device_units, e.start, e.end);
        // A DRA line's resource names the DeviceClass its devices came from
        // (`dra.kaccel.io/<flavor>`): finance sees the DeviceClass.
        let device_class = crate::plan::kueue_counting::device_class_of_resource(&e.resource);
        // The settlement Post of an evicted admission says why (lifecycle::EVICTED_PREFIX).
        // (Most entries have no reason: no substring search for them.)
        let eviction = (!e.reason.is_empty())
            .then(|| {
                e.reason
                    .split_once(crate::ledger::lifecycle::EVICTED_PREFIX)
            })
            .flatten()
            .map(|(_, why)| why);
        let account = if e.team.is_empty() {
            &e.budget
        } else {
            &e.team
        };
        let has_workload = !e.workload_uid.is_empty();
        let has_flavor = !e.flavor.is_empty();
        let decimal = |value: Fixed| move |b: &mut String| value.push_to(b);
        let timestamp = |secs: i64| move |b: &mut String| push_rfc3339(b, secs);
        let parties = &self.parties;
        let mut row = Fields::new(&mut self.out, &mut self.scratch, &FOCUS_HEADER);
        row.number("BilledCost", decimal(billed))?;
        row.text("BillingAccountId", account)?;
        row.text("BillingAccountName", account)?;
        row.text("BillingCurrency", &self.pricing.currency)?;
        row.number("BillingPeriodEnd", |b| b.push_str(&billing_month.end_text))?;
        row.number("BillingPeriodStart", |b| {
            b.push_str(&billing_month.start_text)
        })?;
        row.constant("ChargeCategory", category)?;
        row.constant("ChargeClass", class)?;
        row.built("ChargeDescription", |b| {
            if usage {
                push_usage_description(b, e, device_class.as_deref(), device_secs);
            } else {
                push_correction_description(b, e, credits);
            }
        })?;
        row.constant("ChargeFrequency", "Usage-Based")?;
        row.number("ChargePeriodEnd", timestamp(e.end))?;
        row.number("ChargePeriodStart", timestamp(e.start))?;
        row.number_if("ConsumedQuantity", usage, |b| {
            push_decimal(b, device_secs, 0)
        })?;
        row.constant("ConsumedUnit", usage.then_some("Device-Seconds"))?;
        row.number("ContractedCost", decimal(list_cost))?;
        optional_decimal(&mut row, "ContractedUnitPrice", unit_price)?;
        row.number("EffectiveCost", decimal(billed))?;
        row.text("InvoiceIssuerName", &parties.invoice_issuer)?;
        row.number("ListCost", decimal(list_cost))?;
        optional_decimal(&mut row, "ListUnitPrice", unit_price)?;
        row.constant("PricingCategory", usage.then_some("Standard"))?;
        row.constant("PricingCurrency", "CREDITS")?;
        optional_decimal(&mut row, "PricingCurrencyContractedUnitPrice", unit_credits)?;
        row.number("PricingCurrencyEffectiveCost", decimal(credits))?;
        optional_decimal(&mut row, "PricingCurrencyListUnitPrice", unit_credits)?;
        optional_decimal(
            &mut row,
            "PricingQuantity",
            priced.as_ref().map(|p| p.quantity),
        )?;
        row.constant("PricingUnit", priced.as_ref().map(|p| p.unit))?;
        row.text("ProviderName", &parties.provider)?;
        row.text("PublisherName", &parties.publisher)?;
        row.optional("ResourceId", non_empty(&e.workload_uid))?;
        row.built_if("ResourceName", has_workload, |b| {
            b.push_str(&e.namespace);
            b.push('/');
            b.push_str(&e.workload);
        })?;
        row.constant("ResourceType", has_workload.then_some("Kueue Workload"))?;
        row.constant("ServiceCategory", "AI and Machine Learning")?;
        row.constant("ServiceName", "kaccel")?;
        row.constant("ServiceSubcategory", "AI Platforms")?;
        row.optional("SkuId", non_empty(&e.flavor))?;
        row.constant("SkuMeter", has_flavor.then_some("Accelerator Time"))?;
        row.constant("SkuPriceDetails", None)?;
        row.built_if("SkuPriceId", has_flavor, |b| {
            b.push_str(&e.rate_card);
            b.push('/');
            b.push_str(&e.class);
            b.push('/');
            b.push_str(&e.flavor);
        })?;
        row.text("SubAccountId", &e.budget)?;
        row.text("SubAccountName", &e.budget)?;
        row.built("Tags", |b| push_tags(b, e, device_class.as_deref()))?;
        row.number("x_LedgerEntryId", |b| push_int(b, s.id))?;
        row.text("x_IdempotencyKey", &e.key)?;
        row.optional("x_Class", non_empty(&e.class))?;
        row.optional("x_Flavor", non_empty(&e.flavor))?;
        row.optional("x_EvictionReason", eviction)?;
        // The devices (UUIDs) its pods held, space-separated, where known.
        row.built_if("x_Devices", !e.devices.is_empty(), |b| {
            push_joined(b, &e.devices, ' ')
        })?;
        // The MultiKueue worker cluster it ran in (FOCUS has no cluster
        // column; NULL for this cluster).
        row.optional("x_Cluster", non_empty(&e.cluster))?;
        row.end()?;
        self.rows += 1;
        Ok(())
    }
}

/// A text column that is null where the text is empty.
fn non_empty(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

/// A decimal column that is null where there is no value.
fn optional_decimal<W: Write>(
    row: &mut Fields<'_, W>,
    column: &str,
    value: Option<Fixed>,
) -> std::io::Result<()> {
    match value {
        Some(v) => row.number(column, |b| v.push_to(b)),
        None => row.optional(column, None),
    }
}

/// "8 x nvidia.com/gpu (h100) for 3600 device-seconds at 2.5 credits per
/// device-hour, workload ns/name (admission 1) in class c".
fn push_usage_description(
    out: &mut String,
    e: &Entry,
    device_class: Option<&str>,
    device_secs: i128,
) {
    push_decimal(out, e.device_units.into(), 0);
    out.push_str(" x ");
    match device_class {
        Some(dc) => {
            out.push_str("DeviceClass ");
            out.push_str(dc);
        }
        None => out.push_str(&e.resource),
    }
    out.push_str(" (");
    out.push_str(&e.flavor);
    out.push_str(") for ");
    push_decimal(out, device_secs, 0);
    out.push_str(" device-seconds at ");
    push_decimal(out, e.rate.into(), 6);
    out.push_str(" credits per device-hour, workload ");
    push_workload(out, e);
    out.push_str(" in class ");
    out.push_str(&e.class);
}

/// "Correction of -1.5 credits for workload ns/name (admission 1): reason".
fn push_correction_description(out: &mut String, e: &Entry, credits: Fixed) {
    out.push_str("Correction of ");
    credits.push_to(out);
    out.push_str(" credits for workload ");
    push_workload(out, e);
    out.push_str(": ");
    out.push_str(&e.reason);
}

/// "ns/name (admission 1)".
fn push_workload(out: &mut String, e: &Entry) {
    out.push_str(&e.namespace);
    out.push('/');
    out.push_str(&e.workload);
    out.push_str(" (admission ");
    push_int(out, e.admission.into());
    out.push(')');
}

/// The Tags column: a JSON object of kaccel's keys, in key order.
fn push_tags(out: &mut String, e: &Entry, device_class: Option<&str>) {
    out.push('{');
    let mut tag = |name: &str, value: &str| {
        if out.len() > 1 {
            out.push(',');
        }
        push_json_string(out, name);
        out.push(':');
        push_json_string(out, value);
    };
    let mut admission = String::with_capacity(10);
    push_int(&mut admission, e.admission.into());
    tag("kaccel.io/admission", &admission);
    tag("kaccel.io/budget", &e.budget);
    if let Some(dc) = device_class {
        tag("kaccel.io/deviceClass", dc);
    }
    tag("kaccel.io/namespace", &e.namespace);
    tag("kaccel.io/resource", &e.resource);
    tag("kaccel.io/workload", &e.workload);
    out.push('}');
}

#[cfg(test)]
mod json_tests {
    use super::push_json_string;
    use proptest::prelude::*;

    proptest! {
        /// Tags are written by hand for speed; they must be byte for byte what
        /// serde_json writes, for any text a tag can hold.
        #[test]
        fn json_strings_match_serde_json(v in "\\PC*|[\\x00-\\x7f]{0,40}") {
            let mut ours = String::new();
            push_json_string(&mut ours, &v);
            prop_assert_eq!(ours, serde_json::to_string(&v).unwrap());
        }
    }
}
