//! The order in which object keys appear in JSON text.
//!
//! serde_json's `Value` keeps object keys sorted (unless the workspace turns on its
//! `preserve_order` feature, which would change every crate's JSON output), but a schema's
//! `properties` order is the order the model must generate. So the text is read a second
//! time and each object's key order is recorded under its path.

use std::collections::HashMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Key order per object, keyed by path: `#`, then `/key` or `/index` per step, unescaped.
pub(crate) type KeyOrder = HashMap<String, Vec<String>>;

/// Records the key order of every object in `text`, which must be valid JSON.
pub(crate) fn key_order(text: &str) -> Result<KeyOrder, serde_json::Error> {
    let mut order = KeyOrder::new();
    let mut de = serde_json::Deserializer::from_str(text);
    Recorder {
        order: &mut order,
        path: "#".to_string(),
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(order)
}

struct Recorder<'a> {
    order: &'a mut KeyOrder,
    path: String,
}

impl<'de> DeserializeSeed<'de> for Recorder<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Recorder<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = format!("{}/{key}", self.path);
            map.next_value_seed(Recorder {
                order: self.order,
                path,
            })?;
            keys.push(key);
        }
        self.order.insert(self.path, keys);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Recorder {
                order: self.order,
                path: format!("{}/{i}", self.path),
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}
