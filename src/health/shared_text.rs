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

struct Table {
    texts: HashSet<Arc<str>>,
    most: usize,
    unshared_since_sweep: usize,
    sweeps: u64,
}

impl Table {
    fn new(most: usize) -> Self {
        Table {
            texts: HashSet::new(),
            most,
            unshared_since_sweep: 0,
            sweeps: 0,
        }
    }

    /// The shared copy of `text` (a fresh one when the table has no room).
    fn share(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.texts.get(text) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(text);
        // A full table is swept again only after an eighth of its size was
        // refused since the last sweep: full of texts readings hold, it would
        // otherwise be scanned whole for every new text.
        if self.texts.len() >= self.most && self.unshared_since_sweep >= self.most / 8 {
            // Only the table holds these: no reading would share them again soon.
            self.texts.retain(|t| Arc::strong_count(t) > 1);
            self.unshared_since_sweep = 0;
            self.sweeps += 1;
        }
        if self.texts.len() < self.most {
            self.texts.insert(shared.clone());
        } else {
            self.unshared_since_sweep += 1;
        }
        shared
    }
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| Mutex::new(Table::new(MOST_SHARED)));

/// A text shared between readings (compares, orders and serialises as the text).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedText(Arc<str>);

impl SharedText {
    /// The shared copy of `text`, added to the table when new.
    pub fn new(text: &str) -> Self {
        let mut table = TABLE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        SharedText(table.share(text))
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

/// A reading's small map of fields (metric name -> value, label -> value, trend
/// signal -> vendor fields): sorted pairs in one exact-size allocation. A
/// `BTreeMap` allocates a whole 11-entry leaf even for one entry, and the tracker
/// keeps several such maps for every device of the fleet.
#[derive(Clone, PartialEq)]
pub struct FieldMap<V> {
    pairs: Vec<(SharedText, V)>,
}

impl<V> Default for FieldMap<V> {
    fn default() -> Self {
        FieldMap { pairs: Vec::new() }
    }
}

impl<V> FieldMap<V> {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.pairs.binary_search_by(|(k, _)| k.as_str().cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<&V> {
        self.find(name).ok().map(|i| &self.pairs[i].1)
    }

    pub fn get_key_value(&self, name: &str) -> Option<(&SharedText, &V)> {
        self.find(name)
            .ok()
            .map(|i| (&self.pairs[i].0, &self.pairs[i].1))
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut V> {
        self.find(name).ok().map(|i| &mut self.pairs[i].1)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Sets `name` to `value`, returning what it replaced.
    pub fn insert(&mut self, name: impl Into<SharedText>, value: V) -> Option<V> {
        let name = name.into();
        match self.find(&name) {
            Ok(i) => Some(std::mem::replace(&mut self.pairs[i].1, value)),
            Err(i) => {
                self.pairs.insert(i, (name, value));
                None
            }
        }
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    pub fn clear(&mut self) {
        self.pairs.clear();
    }

    /// Drops the spare room building left (the map is kept, not grown, after).
    pub fn shrink_to_fit(&mut self) {
        self.pairs.shrink_to_fit();
    }

    /// In name order.
    pub fn iter(&self) -> impl Iterator<Item = (&SharedText, &V)> {
        self.pairs.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &SharedText> {
        self.pairs.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.pairs.iter().map(|(_, v)| v)
    }
}

impl<V> std::ops::Index<&str> for FieldMap<V> {
    type Output = V;
    fn index(&self, name: &str) -> &V {
        self.get(name)
            .unwrap_or_else(|| panic!("no field {name:?} in the reading"))
    }
}

impl<'a, V> IntoIterator for &'a FieldMap<V> {
    type Item = (&'a SharedText, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (SharedText, V)>,
        fn(&'a (SharedText, V)) -> (&'a SharedText, &'a V),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.pairs.iter().map(|(k, v)| (k, v))
    }
}

impl<K: Into<SharedText>, V> FromIterator<(K, V)> for FieldMap<V> {
    /// A name given twice keeps its last value, as a map's `collect` does.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = FieldMap::default();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map.shrink_to_fit();
        map
    }
}

impl<V: fmt::Debug> fmt::Debug for FieldMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V: Serialize> Serialize for FieldMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for FieldMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = std::collections::BTreeMap::<String, V>::deserialize(deserializer)?;
        Ok(map.into_iter().collect())
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
    fn a_full_table_sweeps_what_no_reading_holds_rarely_and_never_grows_past_its_bound() {
        // A table of its own: the process-wide one is shared with every test.
        let mut table = Table::new(64);
        let held: Vec<Arc<str>> = (0..8).map(|i| table.share(&format!("held-{i}"))).collect();
        // Many more unheld texts than it takes: it fills, refuses, sweeps once
        // an eighth of its size was refused, and takes new texts again.
        for i in 0..(64 + 2 * 8) {
            drop(table.share(&format!("invented-{i}")));
        }
        assert_eq!(table.sweeps, 1);
        assert!(table.texts.len() < 64, "{} texts", table.texts.len());
        let fresh = table.share("after the sweep");
        assert!(Arc::ptr_eq(&fresh, &table.share("after the sweep")));
        // What readings still hold stays shared.
        for (i, h) in held.iter().enumerate() {
            assert!(Arc::ptr_eq(h, &table.share(&format!("held-{i}"))));
        }

        // Full of texts readings hold: new texts stay unshared, and the table
        // is scanned once per eighth of its size refused, not per text.
        let mut table = Table::new(64);
        let kept: Vec<Arc<str>> = (0..64).map(|i| table.share(&format!("kept-{i}"))).collect();
        for i in 0..(8 * 10) {
            let text = format!("no room-{i}");
            let shared = table.share(&text);
            assert!(
                !Arc::ptr_eq(&shared, &table.share(&text)),
                "no room: unshared"
            );
        }
        assert_eq!(table.texts.len(), 64);
        assert!(
            table.sweeps <= 20,
            "{} sweeps for 160 refusals",
            table.sweeps
        );
        drop(kept);
    }

    #[test]
    fn a_field_map_reads_like_a_sorted_map_in_one_exact_allocation() {
        let mut map: FieldMap<f64> = [("b", 2.0), ("a", 1.0), ("b", 3.0)].into_iter().collect();
        assert_eq!(map.len(), 2, "a name given twice keeps its last value");
        assert_eq!(map.get("b"), Some(&3.0));
        assert_eq!(map["a"], 1.0);
        assert_eq!(map.pairs.capacity(), 2);
        assert_eq!(map.insert("c", 4.0), None);
        assert_eq!(map.insert("a", 5.0), Some(1.0));
        *map.get_mut("c").unwrap() += 1.0;
        let names: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(map.contains_key("c") && !map.contains_key("d"));
        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(json, r#"{"a":5.0,"b":3.0,"c":5.0}"#);
        assert_eq!(serde_json::from_str::<FieldMap<f64>>(&json).unwrap(), map);
        assert_eq!(format!("{map:?}"), r#"{"a": 5.0, "b": 3.0, "c": 5.0}"#);
    }
}
