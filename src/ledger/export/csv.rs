//! The plain CSV export (one row per entry) and the RFC 4180 writer FOCUS shares.
//!
//! **Plain CSV.** `credits` is the entry's amount as recorded: non-negative, signed
//! only for `Correction`; what it does depends on `kind`, so summing it across
//! kinds double-counts (a Reserve and its Post both carry the amount). The signed
//! `grantedDelta`, `reservedDelta`, `spentDelta` and `remainingDelta` columns are
//! each entry's effect on its budget's balances ([`Balances::apply`], the rule the
//! stores and `verify` use): summed over all of a budget's rows they equal its
//! granted, reserved, spent and remaining credits.

use std::io::{self, Write};

use super::numbers::{decimal, micro_device_hours};
use super::{Exporter, rfc3339};
use crate::ledger::entry::{Balances, format_micros};
use crate::ledger::store::StoredEntry;

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

pub(super) fn record<S: AsRef<str>>(out: &mut impl Write, fields: &[S]) -> io::Result<()> {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        field(out, f.as_ref())?;
    }
    out.write_all(b"\r\n")
}

pub const CSV_HEADER: [&str; 26] = [
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
    "devices",
];

impl<W: Write> Exporter<W> {
    pub(super) fn csv(&mut self, s: &StoredEntry) -> io::Result<()> {
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
                // The devices its pods held, space-separated (empty: unknown).
                e.devices.join(" "),
            ],
        )?;
        self.rows += 1;
        Ok(())
    }
}
