//! The plain CSV export (one row per entry) and the RFC 4180 writer FOCUS shares.
//!
//! **Plain CSV.** `credits` is the entry's amount as recorded: non-negative, signed
//! only for `Correction`; what it does depends on `kind`, so summing it across
//! kinds double-counts (a Reserve and its Post both carry the amount). The signed
//! `grantedDelta`, `reservedDelta`, `spentDelta` and `remainingDelta` columns are
//! each entry's effect on its budget's balances ([`Balances::apply`], the rule the
//! stores and `verify` use): summed over all of a budget's rows they equal its
//! granted, reserved, spent and remaining credits.

use std::borrow::Cow;
use std::io::{self, Write};

use super::numbers::decimal;
use super::{ExportError, Exporter, entry_micro_device_hours, rfc3339};
use crate::ledger::entry::{Balances, format_micros};
use crate::ledger::store::StoredEntry;

/// Writes one CSV field, quoting when needed (RFC 4180).
fn field(out: &mut impl Write, s: &str) -> io::Result<()> {
    let bytes = s.as_bytes();
    let special = |b: &u8| matches!(b, b',' | b'"' | b'\n' | b'\r');
    if bytes.iter().any(special) || s.starts_with(' ') || s.ends_with(' ') {
        out.write_all(b"\"")?;
        for (i, part) in s.split('"').enumerate() {
            if i > 0 {
                out.write_all(b"\"\"")?;
            }
            out.write_all(part.as_bytes())?;
        }
        out.write_all(b"\"")
    } else {
        out.write_all(bytes)
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

pub const CSV_HEADER: [&str; 27] = [
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
    "cluster",
];

impl<W: Write> Exporter<W> {
    pub(super) fn csv(&mut self, s: &StoredEntry) -> Result<(), ExportError> {
        let e = &s.entry;
        let device_hours = entry_micro_device_hours(s)?;
        // The entry's signed effect on its budget, by the one rule balances use.
        let mut delta = Balances::default();
        delta.apply(e.kind, e.credits);
        fn text(v: &str) -> Cow<'_, str> {
            Cow::Borrowed(v)
        }
        record(
            &mut self.out,
            &[
                Cow::Owned(s.id.to_string()),
                text(&e.key),
                text(e.kind.as_str()),
                text(&e.budget),
                text(&e.team),
                text(&e.namespace),
                text(&e.workload),
                text(&e.workload_uid),
                Cow::Owned(e.admission.to_string()),
                text(&e.class),
                text(&e.flavor),
                text(&e.resource),
                Cow::Owned(e.device_units.to_string()),
                Cow::Owned(rfc3339(e.start)),
                Cow::Owned(rfc3339(e.end)),
                Cow::Owned(format_micros(i128::from(e.credits))),
                text(&e.rate_card),
                text(&e.reason),
                Cow::Owned(rfc3339(e.created_at)),
                Cow::Owned(decimal(device_hours, 6)),
                Cow::Owned(format_micros(i128::from(e.rate))),
                Cow::Owned(format_micros(delta.granted)),
                Cow::Owned(format_micros(delta.reserved)),
                Cow::Owned(format_micros(delta.spent)),
                Cow::Owned(format_micros(delta.remaining())),
                // The devices its pods held, space-separated (empty: unknown).
                Cow::Owned(e.devices.join(" ")),
                // The MultiKueue worker it ran in (empty: this cluster).
                Cow::Borrowed(e.cluster.as_str()),
            ],
        )?;
        self.rows += 1;
        Ok(())
    }
}
