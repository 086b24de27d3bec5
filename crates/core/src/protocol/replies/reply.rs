//! What makes a type a reply ([`Reply`]) and how one goes on the wire
//! ([`Outcome::reply`]) and comes off it ([`decode`]).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::protocol::frames::{ErrorBody, ErrorCode, Outcome};

/// A type the supervisor answers with.
pub trait Reply: Serialize {}

impl Outcome {
    /// The result `reply`, as it goes on the wire.
    pub fn reply<R: Reply>(reply: &R) -> Outcome {
        match serde_json::to_value(reply) {
            Ok(v) => Outcome::Result(v),
            // Plain data does not fail to encode; said, not hidden.
            Err(e) => Outcome::Error(ErrorBody {
                code: ErrorCode::Internal,
                message: format!("cannot encode the reply: {e}"),
                data: None,
            }),
        }
    }
}

/// Read a reply from its JSON (what [`crate::protocol::client::Client::call_as`]
/// and a test use).
pub fn decode<R: DeserializeOwned>(v: Value) -> Result<R, serde_json::Error> {
    serde_json::from_value(v)
}
