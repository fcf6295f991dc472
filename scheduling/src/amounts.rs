//! What one share consumes, by capacity name, in the compact form a node holds for every
//! prepared share: a short sorted list in one allocation, not a map (a `BTreeMap`'s first node
//! is 640 bytes, for the three figures a share usually has). Its JSON is the map's.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Quantity;

/// What one share consumes, sorted by capacity name, each name once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Amounts(Box<[(Box<str>, Quantity)]>);

impl Amounts {
    /// The amount of capacity `name`, if the share consumes it.
    pub fn get(&self, name: &str) -> Option<&Quantity> {
        self.0.binary_search_by(|(n, _)| (**n).cmp(name)).ok().map(|i| &self.0[i].1)
    }

    /// Each capacity and its amount, by name.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Quantity)> {
        self.0.iter().map(|(n, q)| (&**n, q))
    }
}

impl std::ops::Index<&str> for Amounts {
    type Output = Quantity;

    /// The amount of capacity `name`, as a map indexes.
    ///
    /// # Panics
    /// When the share does not consume `name`.
    fn index(&self, name: &str) -> &Quantity {
        self.get(name).unwrap_or_else(|| panic!("no capacity {name:?} in these amounts"))
    }
}

impl From<BTreeMap<String, Quantity>> for Amounts {
    fn from(map: BTreeMap<String, Quantity>) -> Self {
        // A map's order is the names' order, and each name is there once.
        Self(map.into_iter().map(|(n, q)| (n.into_boxed_str(), q)).collect())
    }
}

impl<const N: usize> From<[(&str, Quantity); N]> for Amounts {
    fn from(pairs: [(&str, Quantity); N]) -> Self {
        // Through a map: sorted, and a repeated name keeps its last amount, as a map would.
        Self::from(pairs.into_iter().map(|(n, q)| (n.to_owned(), q)).collect::<BTreeMap<_, _>>())
    }
}

impl Serialize for Amounts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Amounts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<String, Quantity>::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs.iter().map(|(n, v)| ((*n).to_owned(), q(v))).collect()
    }

    #[test]
    fn it_answers_as_the_map_it_was_made_from() {
        let maps = [
            map(&[]),
            map(&[("memory", "4Gi")]),
            map(&[("shares", "1"), ("memory", "4Gi"), ("cores", "50")]),
            map(&[("z", "1"), ("a", "2"), ("m", "3"), ("b", "4"), ("y", "5")]),
        ];
        for m in maps {
            let a = Amounts::from(m.clone());
            assert_eq!(a.iter().len(), m.len());
            assert_eq!(a.iter().map(|(n, q)| (n.to_owned(), *q)).collect::<Vec<_>>(), m.clone().into_iter().collect::<Vec<_>>());
            for name in ["a", "b", "cores", "memory", "shares", "m", "y", "z", "", "nope", "memoryx"] {
                assert_eq!(a.get(name), m.get(name), "{name} in {m:?}");
            }
            for (name, amount) in &m {
                assert_eq!(a[name.as_str()], *amount);
            }
        }
    }

    #[test]
    fn its_json_is_the_maps() {
        let m = map(&[("shares", "1"), ("memory", "4Gi"), ("cores", "50")]);
        let json = serde_json::to_string(&Amounts::from(m.clone())).unwrap();
        assert_eq!(json, serde_json::to_string(&m).unwrap());
        assert_eq!(serde_json::from_str::<Amounts>(&json).unwrap(), Amounts::from(m));
        // Keys in any order, and a repeated one, read as a map reads them.
        let messy = r#"{"memory":"1Gi","cores":"5","memory":"4Gi"}"#;
        let read: Amounts = serde_json::from_str(messy).unwrap();
        assert_eq!(read, Amounts::from(serde_json::from_str::<BTreeMap<String, Quantity>>(messy).unwrap()));
        for bad in [r#"["memory"]"#, r#"{"memory":"lots"}"#, r#"{"memory":1.5e400}"#, "null"] {
            assert!(serde_json::from_str::<Amounts>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    #[should_panic(expected = "no capacity \"cores\"")]
    fn indexing_a_capacity_it_lacks_panics_as_a_map_does() {
        let _ = Amounts::from([("memory", q("1Gi"))])["cores"];
    }

    #[test]
    fn a_repeated_name_in_pairs_keeps_its_last_amount() {
        let a = Amounts::from([("memory", q("1Gi")), ("cores", q("5")), ("memory", q("4Gi"))]);
        assert_eq!(a, Amounts::from(map(&[("cores", "5"), ("memory", "4Gi")])));
    }
}
