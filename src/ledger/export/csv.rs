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

use super::{ExportError, Exporter, entry_micro_device_hours};
use crate::k8s::time::push_rfc3339;
use crate::ledger::decimal::{push_decimal, push_int};
use crate::ledger::entry::Balances;
use crate::ledger::store::StoredEntry;

/// Whether a field must be quoted (RFC 4180: a comma, quote or line break;
/// and, so spreadsheets keep them, leading or trailing spaces).
fn needs_quotes(s: &str) -> bool {
    let bytes = s.as_bytes();
    // No early exit per byte: the compiler then checks a chunk at a time.
    let special = |chunk: &[u8]| {
        chunk.iter().fold(false, |found, &b| {
            found | matches!(b, b',' | b'"' | b'\n' | b'\r')
        })
    };
    bytes.chunks(32).any(special) || s.starts_with(' ') || s.ends_with(' ')
}

/// Writes one CSV field, quoting when needed (RFC 4180).
fn field(out: &mut impl Write, s: &str) -> io::Result<()> {
    let bytes = s.as_bytes();
    if !needs_quotes(s) {
        return out.write_all(bytes);
    }
    out.write_all(b"\"")?;
    let mut rest = bytes;
    // (A byte-at-a-time search was a tenth of a FOCUS export's CPU: its
    // description and Tags columns are quoted, and Tags is full of quotes.)
    while let Some(quote) = memchr::memchr(b'"', rest) {
        out.write_all(&rest[..=quote])?;
        out.write_all(b"\"")?;
        rest = &rest[quote + 1..];
    }
    out.write_all(rest)?;
    out.write_all(b"\"")
}

/// One record written field by field straight into the output, computed
/// values built in one reused buffer: a row allocates nothing. Each field
/// names its column; debug builds (the tests) check the names against the
/// header, so a field cannot land in another column unnoticed.
pub(super) struct Fields<'a, W: Write> {
    out: &'a mut W,
    scratch: &'a mut String,
    header: &'static [&'static str],
    written: usize,
}

impl<'a, W: Write> Fields<'a, W> {
    pub(super) fn new(
        out: &'a mut W,
        scratch: &'a mut String,
        header: &'static [&'static str],
    ) -> Self {
        Fields {
            out,
            scratch,
            header,
            written: 0,
        }
    }

    fn next_column(&mut self, column: &str) -> io::Result<()> {
        debug_assert_eq!(self.header.get(self.written).copied(), Some(column));
        self.written += 1;
        if self.written > 1 {
            self.out.write_all(b",")?;
        }
        Ok(())
    }

    /// A text column.
    pub(super) fn text(&mut self, column: &str, value: &str) -> io::Result<()> {
        self.next_column(column)?;
        field(self.out, value)
    }

    /// A column that may be null (an empty, unquoted field).
    pub(super) fn optional(&mut self, column: &str, value: Option<&str>) -> io::Result<()> {
        self.next_column(column)?;
        match value {
            Some(v) => field(self.out, v),
            None => Ok(()),
        }
    }

    /// A column holding one of kaccel's own constant texts (a kind, a unit, a
    /// category), or null: none needs quoting, so none is scanned for it
    /// (checked in debug builds). An export writes a dozen a row.
    pub(super) fn constant(
        &mut self,
        column: &str,
        value: impl Into<Option<&'static str>>,
    ) -> io::Result<()> {
        self.next_column(column)?;
        match value.into() {
            Some(v) => {
                debug_assert!(!needs_quotes(v), "{column}: {v:?} needs quotes");
                self.out.write_all(v.as_bytes())
            }
            None => Ok(()),
        }
    }

    /// A column whose text `build` appends, made of digits, signs, points and
    /// the letters and colons of a timestamp: never quoted, so never scanned
    /// (checked in debug builds). An export writes about 15 a row.
    pub(super) fn number(
        &mut self,
        column: &str,
        build: impl FnOnce(&mut String),
    ) -> io::Result<()> {
        self.next_column(column)?;
        self.scratch.clear();
        build(self.scratch);
        debug_assert!(
            !needs_quotes(self.scratch),
            "{column}: {:?} needs quotes",
            self.scratch
        );
        self.out.write_all(self.scratch.as_bytes())
    }

    /// A [`number`](Self::number) column where `present`, null otherwise.
    pub(super) fn number_if(
        &mut self,
        column: &str,
        present: bool,
        build: impl FnOnce(&mut String),
    ) -> io::Result<()> {
        if present {
            self.number(column, build)
        } else {
            self.optional(column, None)
        }
    }

    /// A column whose text `build` appends to an empty buffer.
    pub(super) fn built(
        &mut self,
        column: &str,
        build: impl FnOnce(&mut String),
    ) -> io::Result<()> {
        self.next_column(column)?;
        self.scratch.clear();
        build(self.scratch);
        field(self.out, self.scratch)
    }

    /// A column built as [`built`](Self::built) where `present`, null
    /// otherwise.
    pub(super) fn built_if(
        &mut self,
        column: &str,
        present: bool,
        build: impl FnOnce(&mut String),
    ) -> io::Result<()> {
        if present {
            self.built(column, build)
        } else {
            self.optional(column, None)
        }
    }

    /// Ends the record; every column of the header must have been written.
    pub(super) fn end(self) -> io::Result<()> {
        debug_assert_eq!(self.written, self.header.len());
        self.out.write_all(b"\r\n")
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
        let mut row = Fields::new(&mut self.out, &mut self.scratch, &CSV_HEADER);
        row.number("id", |b| push_int(b, s.id))?;
        row.text("key", &e.key)?;
        row.constant("kind", e.kind.as_str())?;
        row.text("budget", &e.budget)?;
        row.text("team", &e.team)?;
        row.text("namespace", &e.namespace)?;
        row.text("workload", &e.workload)?;
        row.text("workloadUid", &e.workload_uid)?;
        row.number("admission", |b| push_int(b, e.admission.into()))?;
        row.text("class", &e.class)?;
        row.text("flavor", &e.flavor)?;
        row.text("resource", &e.resource)?;
        row.number("deviceUnits", |b| push_decimal(b, e.device_units.into(), 0))?;
        row.number("start", |b| push_rfc3339(b, e.start))?;
        row.number("end", |b| push_rfc3339(b, e.end))?;
        row.number("credits", |b| push_decimal(b, e.credits.into(), 6))?;
        row.text("rateCard", &e.rate_card)?;
        row.text("reason", &e.reason)?;
        row.number("createdAt", |b| push_rfc3339(b, e.created_at))?;
        row.number("deviceHours", |b| push_decimal(b, device_hours, 6))?;
        row.number("ratePerDeviceHour", |b| push_decimal(b, e.rate.into(), 6))?;
        row.number("grantedDelta", |b| push_decimal(b, delta.granted, 6))?;
        row.number("reservedDelta", |b| push_decimal(b, delta.reserved, 6))?;
        row.number("spentDelta", |b| push_decimal(b, delta.spent, 6))?;
        row.number("remainingDelta", |b| push_decimal(b, delta.remaining(), 6))?;
        // The devices its pods held, space-separated (empty: unknown).
        row.built("devices", |b| push_joined(b, &e.devices, ' '))?;
        // The MultiKueue worker it ran in (empty: this cluster).
        row.text("cluster", &e.cluster)?;
        row.end()?;
        self.rows += 1;
        Ok(())
    }
}

/// Appends `items` separated by `separator`.
pub(super) fn push_joined(out: &mut String, items: &[String], separator: char) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(separator);
        }
        out.push_str(item);
    }
}
