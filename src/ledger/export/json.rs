//! The JSON lines export: each entry as stored, with its `id` and exact decimal credits.

use std::io::{self, Write};

use super::Exporter;
use crate::ledger::entry::format_micros;
use crate::ledger::store::StoredEntry;

impl<W: Write> Exporter<W> {
    pub(super) fn json(&mut self, s: &StoredEntry) -> io::Result<()> {
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
