//! Serialisation of openraft values stored in RocksDB. JSON keeps the on-disk format
//! inspectable and independent of struct layout; one module so it can be swapped as a unit.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Encodes a value.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(value)
}

/// Decodes a value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}
