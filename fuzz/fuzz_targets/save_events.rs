//! A SaveEventsV2 request as bytes off the wire, through the server's own path: protobuf
//! decoding, wire-to-domain conversion, event validation and observation normalisation.
//! Nothing may panic; what validates must validate again unchanged, and normalised
//! observations are a fixed point of normalisation.
#![no_main]

use cairn_core::event::{RawEvent, validate_events};
use cairn_core::limits::DEFAULT_MAX_EVENT_BYTES;
use cairn_core::query::normalize_observations;
use cairn_proto::convert::{observation_from_wire, raw_event_from_wire};
use cairn_proto::orisun as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = pb::SaveEventsV2Request::decode(data) else {
        return;
    };
    let raw: Vec<RawEvent> = request
        .events
        .into_iter()
        .map(raw_event_from_wire)
        .collect();
    if let Ok(events) = validate_events(raw, DEFAULT_MAX_EVENT_BYTES) {
        let again: Vec<RawEvent> = events
            .iter()
            .map(|e| RawEvent {
                event_id: e.event_id.clone(),
                event_type: e.event_type.clone(),
                data: e.data.clone(),
                metadata: e.metadata.clone(),
            })
            .collect();
        let revalidated = validate_events(again, DEFAULT_MAX_EVENT_BYTES)
            .expect("validated events validate again");
        assert_eq!(revalidated, events, "validation is not a fixed point");
    }
    let observations: Result<Vec<_>, _> = request
        .consistency
        .into_iter()
        .enumerate()
        .map(|(i, o)| observation_from_wire(o, i))
        .collect();
    if let Ok(observations) = observations
        && let Ok(normalized) = normalize_observations(observations)
    {
        let again = normalize_observations(normalized.clone()).expect("normalised ones pass");
        assert_eq!(again, normalized, "normalisation is not a fixed point");
    }
});
