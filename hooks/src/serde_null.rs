//! A config key written with no value (`namespaces:`, `evictionSoft: ~`)
//! reads as an empty list or map, as it did before serde-saphyr 2, which asks
//! for a real sequence or mapping for a `Vec` or map field.

use serde::{Deserialize, Deserializer};

/// `#[serde(default, deserialize_with = "qoslet_hooks::serde_null::empty")]`:
/// null (or nothing) is the type's default.
pub fn empty<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
