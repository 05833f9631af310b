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

use std::borrow::Cow;
use std::io::Write;

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::csv::record;
use super::numbers::{Fixed, device_seconds};
use super::{ExportError, Exporter, rfc3339};
use crate::ledger::entry::{EntryKind, format_micros};
use crate::ledger::store::StoredEntry;

/// The UTC calendar month `[start, end)` containing `secs`, the last one
/// asked remembered: an export's rows mostly fall in one month.
fn month_of(secs: i64) -> (i64, i64) {
    thread_local! {
        static LAST: std::cell::Cell<(i64, i64)> = const { std::cell::Cell::new((0, 0)) };
    }
    let (start, end) = LAST.get();
    if start <= secs && secs < end {
        return (start, end);
    }
    let month = compute_month_of(secs);
    LAST.set(month);
    month
}

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
        let (period_start, period_end) = month_of(e.start);
        let (created_month, _) = month_of(e.created_at);
        let class = (e.kind == EntryKind::Correction && period_start < created_month)
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
                (Some(unit.text()), cost.text())
            }
            None => (None, billed.text()),
        };
        let unit_credits = priced.as_ref().map(|p| p.unit_credits.text());
        let billed_text = billed.text();
        let device_secs = device_seconds(e.device_units, e.start, e.end);
        // A DRA line's resource names the DeviceClass its devices came from
        // (`dra.kaccel.io/<flavor>`): finance sees the DeviceClass.
        let device_class = crate::plan::kueue_counting::device_class_of_resource(&e.resource);
        let shown_resource = match &device_class {
            Some(dc) => format!("DeviceClass {dc}"),
            None => e.resource.clone(),
        };
        let description = if usage {
            format!(
                "{} x {} ({}) for {} device-seconds at {} credits per device-hour, workload {}/{} (admission {}) in class {}",
                e.device_units,
                shown_resource,
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
        let mut tags = String::with_capacity(160);
        tags.push('{');
        let mut tag = |name: &str, value: &str| {
            if tags.len() > 1 {
                tags.push(',');
            }
            push_json_string(&mut tags, name);
            tags.push(':');
            push_json_string(&mut tags, value);
        };
        tag("kaccel.io/admission", &e.admission.to_string());
        tag("kaccel.io/budget", &e.budget);
        if let Some(dc) = &device_class {
            tag("kaccel.io/deviceClass", dc);
        }
        tag("kaccel.io/namespace", &e.namespace);
        tag("kaccel.io/resource", &e.resource);
        tag("kaccel.io/workload", &e.workload);
        tags.push('}');
        // The settlement Post of an evicted admission says why (lifecycle::EVICTED_PREFIX).
        let eviction = e
            .reason
            .split_once(crate::ledger::lifecycle::EVICTED_PREFIX)
            .map(|(_, why)| why);
        let account = if e.team.is_empty() {
            &e.budget
        } else {
            &e.team
        };
        // Borrowed where the value is already at hand: a row is 48 fields.
        fn some(v: &str) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(v))
        }
        fn non_empty(v: &str) -> Option<Cow<'_, str>> {
            (!v.is_empty()).then_some(Cow::Borrowed(v))
        }
        fn owned<'a>(v: String) -> Option<Cow<'a, str>> {
            Some(Cow::Owned(v))
        }
        let sku_price = format!("{}/{}/{}", e.rate_card, e.class, e.flavor);
        let columns: [(&str, Option<Cow<str>>); 49] = [
            ("BilledCost", some(&billed_text)),
            ("BillingAccountId", some(account)),
            ("BillingAccountName", some(account)),
            ("BillingCurrency", some(&self.pricing.currency)),
            ("BillingPeriodEnd", owned(rfc3339(period_end))),
            ("BillingPeriodStart", owned(rfc3339(period_start))),
            ("ChargeCategory", some(category)),
            ("ChargeClass", class.map(Cow::Borrowed)),
            ("ChargeDescription", owned(description)),
            ("ChargeFrequency", some("Usage-Based")),
            ("ChargePeriodEnd", owned(rfc3339(e.end))),
            ("ChargePeriodStart", owned(rfc3339(e.start))),
            (
                "ConsumedQuantity",
                usage.then(|| device_secs.to_string().into()),
            ),
            ("ConsumedUnit", usage.then_some("Device-Seconds".into())),
            ("ContractedCost", some(&list_cost)),
            (
                "ContractedUnitPrice",
                unit_price.as_deref().map(Cow::Borrowed),
            ),
            ("EffectiveCost", some(&billed_text)),
            ("InvoiceIssuerName", some(&self.parties.invoice_issuer)),
            ("ListCost", some(&list_cost)),
            ("ListUnitPrice", unit_price.as_deref().map(Cow::Borrowed)),
            ("PricingCategory", usage.then_some("Standard".into())),
            ("PricingCurrency", some("CREDITS")),
            (
                "PricingCurrencyContractedUnitPrice",
                unit_credits.as_deref().map(Cow::Borrowed),
            ),
            ("PricingCurrencyEffectiveCost", owned(credits.text())),
            (
                "PricingCurrencyListUnitPrice",
                unit_credits.as_deref().map(Cow::Borrowed),
            ),
            (
                "PricingQuantity",
                priced.as_ref().map(|p| p.quantity.text().into()),
            ),
            ("PricingUnit", priced.as_ref().map(|p| p.unit.into())),
            ("ProviderName", some(&self.parties.provider)),
            ("PublisherName", some(&self.parties.publisher)),
            ("ResourceId", non_empty(&e.workload_uid)),
            (
                "ResourceName",
                (!e.workload_uid.is_empty())
                    .then(|| format!("{}/{}", e.namespace, e.workload).into()),
            ),
            (
                "ResourceType",
                (!e.workload_uid.is_empty()).then_some("Kueue Workload".into()),
            ),
            ("ServiceCategory", some("AI and Machine Learning")),
            ("ServiceName", some("kaccel")),
            ("ServiceSubcategory", some("AI Platforms")),
            ("SkuId", non_empty(&e.flavor)),
            (
                "SkuMeter",
                (!e.flavor.is_empty()).then_some("Accelerator Time".into()),
            ),
            ("SkuPriceDetails", None),
            (
                "SkuPriceId",
                (!e.flavor.is_empty()).then(|| sku_price.into()),
            ),
            ("SubAccountId", some(&e.budget)),
            ("SubAccountName", some(&e.budget)),
            ("Tags", owned(tags)),
            ("x_LedgerEntryId", owned(s.id.to_string())),
            ("x_IdempotencyKey", some(&e.key)),
            ("x_Class", non_empty(&e.class)),
            ("x_Flavor", non_empty(&e.flavor)),
            ("x_EvictionReason", eviction.map(Cow::Borrowed)),
            // The devices (UUIDs) its pods held, space-separated, where known.
            (
                "x_Devices",
                (!e.devices.is_empty()).then(|| e.devices.join(" ").into()),
            ),
            // The MultiKueue worker cluster it ran in (FOCUS has no cluster
            // column; NULL for this cluster).
            ("x_Cluster", non_empty(&e.cluster)),
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
