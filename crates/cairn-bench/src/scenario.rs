//! The scenarios: the anchor tables' names and shapes, plus Cairn's own.

use cairn_proto::orisun as pb;
use clap::ValueEnum;
use rand::Rng;

/// A benchmark scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// One event per write, under an observation of its (fresh) context.
    #[value(name = "write-conditional-1")]
    WriteConditional1,
    /// 100 events per write, under an observation of their (fresh) context.
    #[value(name = "write-conditional-100")]
    WriteConditional100,
    /// One event per write, no observation.
    #[value(name = "write-unconditional-1")]
    WriteUnconditional1,
    /// 100 events per write, no observation.
    #[value(name = "write-unconditional-100")]
    WriteUnconditional100,
    /// GetEvents of one seeded context (10 events).
    #[value(name = "read-conditional")]
    ReadConditional,
    /// GetEvents of 1,000 events from a random position, no query.
    #[value(name = "read-unconditional")]
    ReadUnconditional,
    /// write-unconditional-1 while background clients run read-unconditional.
    #[value(name = "write-unconditional-1-with-readers")]
    WriteUnconditional1WithReaders,
    /// GetLatestByCriteria with 4 criteria (seeded contexts).
    #[value(name = "latest-by-criteria")]
    LatestByCriteria,
    /// GetLatestByCriteria, then SaveEventsV2 with that observation; retry on ALREADY_EXISTS.
    #[value(name = "command-cycle")]
    CommandCycle,
}

impl Scenario {
    /// Every scenario, in the anchor CSVs' order, Cairn's own last.
    pub const ALL: [Scenario; 9] = [
        Scenario::WriteConditional1,
        Scenario::WriteConditional100,
        Scenario::WriteUnconditional1,
        Scenario::WriteUnconditional100,
        Scenario::ReadConditional,
        Scenario::ReadUnconditional,
        Scenario::WriteUnconditional1WithReaders,
        Scenario::LatestByCriteria,
        Scenario::CommandCycle,
    ];

    /// The name used in CSVs and on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::WriteConditional1 => "write-conditional-1",
            Scenario::WriteConditional100 => "write-conditional-100",
            Scenario::WriteUnconditional1 => "write-unconditional-1",
            Scenario::WriteUnconditional100 => "write-unconditional-100",
            Scenario::ReadConditional => "read-conditional",
            Scenario::ReadUnconditional => "read-unconditional",
            Scenario::WriteUnconditional1WithReaders => "write-unconditional-1-with-readers",
            Scenario::LatestByCriteria => "latest-by-criteria",
            Scenario::CommandCycle => "command-cycle",
        }
    }

    /// Events each request writes (the anchors' `events_per_request`; 0 for reads).
    pub fn events_per_request(&self) -> usize {
        match self {
            Scenario::WriteConditional1
            | Scenario::WriteUnconditional1
            | Scenario::WriteUnconditional1WithReaders
            | Scenario::CommandCycle => 1,
            Scenario::WriteConditional100 | Scenario::WriteUnconditional100 => 100,
            Scenario::ReadConditional
            | Scenario::ReadUnconditional
            | Scenario::LatestByCriteria => 0,
        }
    }
}

/// Events per seeded context (orisun-bench: `seed-<i % 100000>`, 10 each for 1M events).
pub const EVENTS_PER_SEED_CONTEXT: u64 = 10;
/// Page size of both read scenarios (orisun-bench's read batch).
pub const READ_COUNT: u32 = 1_000;
/// Target size of an event's data, in bytes.
const EVENT_BYTES: usize = 256;

/// The tag key every benchmark event carries.
pub const CONTEXT_KEY: &str = "benchmark_context";

/// A ~256-byte event in `context`, shaped like orisun-bench's: context, index within the
/// request, a global sequence number, padding.
pub fn event(context: &str, index: usize, seq: u64) -> pb::EventToSave {
    let head = format!(
        r#"{{"{CONTEXT_KEY}":"{context}","event_index":{index},"sequence":{seq},"payload":""#
    );
    let pad = EVENT_BYTES.saturating_sub(head.len() + 2);
    pb::EventToSave {
        event_id: uuid::Uuid::now_v7().to_string(),
        event_type: "BenchmarkEvent".to_string(),
        data: format!("{head}{}\"}}", "x".repeat(pad)),
        metadata: r#"{"source":"cairn-bench"}"#.to_string(),
    }
}

/// A criterion selecting one context.
pub fn context_criterion(context: &str) -> pb::Criterion {
    pb::Criterion {
        tags: vec![pb::Tag {
            key: CONTEXT_KEY.to_string(),
            value: context.to_string(),
        }],
    }
}

/// The name of seeded context `i`.
pub fn seed_context(i: u64) -> String {
    format!("seed-{i}")
}

/// A random seeded context.
pub fn random_seed_context(rng: &mut impl Rng, contexts: u64) -> String {
    seed_context(rng.gen_range(0..contexts.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_about_256_bytes_of_json() {
        let e = event("seed-99999", 3, 123_456);
        assert!((250..=270).contains(&e.data.len()), "{}", e.data.len());
        let v: serde_json::Value = serde_json::from_str(&e.data).expect("json");
        assert_eq!(v[CONTEXT_KEY], "seed-99999");
    }

    #[test]
    fn names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(Scenario::from_str(s.name(), false), Ok(s));
        }
    }
}
