//! Metric names, label names and label values as device readings keep them: one
//! allocation per distinct text, shared by every device that reports it.
//!
//! Every device of a fleet's exporters reports the same metric and label names
//! (dcgm-exporter: about 40 names and 10 labels per GPU) and mostly the same label
//! values (model, driver, node). Kept as a `String` per device they were most of
//! the health tracker's memory; shared, a reading holds pointers.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// At most this many distinct texts are shared at once. When the table is full,
/// texts no reading holds any more (a replaced device's UUID) are swept; when it
/// is still full, a new text is kept unshared: a hostile exporter that invents
/// names costs its own readings' memory, never an unbounded table.
const MOST_SHARED: usize = 1 << 16;

static TABLE: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(Default::default);

/// A text shared between readings (compares, orders and serialises as the text).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedText(Arc<str>);

impl SharedText {
    /// The shared copy of `text`, added to the table when new.
    pub fn new(text: &str) -> Self {
        let mut table = TABLE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(shared) = table.get(text) {
            return SharedText(shared.clone());
        }
        let shared: Arc<str> = Arc::from(text);
        if table.len() >= MOST_SHARED {
            // Only the table holds these: no reading would share them again soon.
            table.retain(|t| Arc::strong_count(t) > 1);
        }
        if table.len() < MOST_SHARED {
            table.insert(shared.clone());
        }
        SharedText(shared)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for SharedText {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SharedText {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedText {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for SharedText {
    fn from(text: &str) -> Self {
        SharedText::new(text)
    }
}

impl From<String> for SharedText {
    fn from(text: String) -> Self {
        SharedText::new(&text)
    }
}

impl From<&String> for SharedText {
    fn from(text: &String) -> Self {
        SharedText::new(text)
    }
}

impl PartialEq<str> for SharedText {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for SharedText {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl fmt::Display for SharedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SharedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for SharedText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(SharedText::new(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_share_one_allocation_and_read_as_the_text() {
        let a = SharedText::new("DCGM_FI_DEV_GPU_TEMP");
        let b = SharedText::from(String::from("DCGM_FI_DEV_GPU_TEMP"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(a.to_string(), "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(format!("{a:?}"), "\"DCGM_FI_DEV_GPU_TEMP\"");
        let map: std::collections::BTreeMap<SharedText, f64> = [(a, 41.0)].into();
        assert_eq!(map.get("DCGM_FI_DEV_GPU_TEMP"), Some(&41.0));
        assert_eq!(
            serde_json::to_string(&map).unwrap(),
            r#"{"DCGM_FI_DEV_GPU_TEMP":41.0}"#
        );
        let back: std::collections::BTreeMap<SharedText, f64> =
            serde_json::from_str(r#"{"DCGM_FI_DEV_GPU_TEMP":41.0}"#).unwrap();
        assert_eq!(back, map);
    }

    #[test]
    fn a_full_table_sweeps_what_no_reading_holds_and_never_grows_past_its_bound() {
        let held: Vec<SharedText> = (0..8)
            .map(|i| SharedText::new(&format!("held-{i}")))
            .collect();
        // Many more distinct texts than the table takes, none kept.
        for i in 0..(MOST_SHARED + 1000) {
            drop(SharedText::new(&format!("invented-{i}")));
        }
        let size = TABLE.lock().unwrap().len();
        assert!(size <= MOST_SHARED, "{size} texts in the table");
        // What readings still hold stays shared.
        for (i, h) in held.iter().enumerate() {
            assert!(Arc::ptr_eq(&h.0, &SharedText::new(&format!("held-{i}")).0));
        }
    }
}
