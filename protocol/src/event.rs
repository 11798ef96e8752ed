//! The observability event stream: one [`EventFrame`] per frame,
//! `{"ts": i64, "kind": "<name>", "payload": {…}}` (the event flattened into
//! the envelope), with every variant and field of the reference's Events page.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use crate::meta::MetaMap;
use crate::WireMessage;

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq)]
pub struct EventFrame {
    /// Nanoseconds since the Unix epoch, host clock at emission.
    pub ts: i64,
    pub event: Event,
}

/// Resources in pool / claim / reservation events.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceAmount {
    pub memory_bytes: u64,
    pub cpus: u32,
}

closed_enum! {
    /// How a test file ended.
    pub enum FileStatus {
        Passed => "passed",
        Failed => "failed",
        TimedOut => "timed_out",
        Crashed => "crashed",
    }
}

macro_rules! events {
    ( $( $(#[$doc:meta])* $variant:ident => $wire:literal { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? } )+ ) => {
        closed_enum! {
            /// The `kind` of every event.
            pub enum EventKind { $( $variant => $wire ),+ }
        }

        $(
            $(#[$doc])*
            #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            #[serde(deny_unknown_fields)]
            pub struct $variant { $( $(#[$fdoc])* pub $field: $ty ),* }
        )+

        #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
        #[derive(Debug, Clone, PartialEq)]
        pub enum Event { $( $variant($variant) ),+ }

        impl Event {
            pub fn kind(&self) -> EventKind {
                match self { $( Event::$variant(_) => EventKind::$variant ),+ }
            }
        }

        struct PayloadRef<'a>(&'a Event);

        impl Serialize for PayloadRef<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self.0 { $( Event::$variant(p) => p.serialize(s) ),+ }
            }
        }

        /// Deserialises the payload of an already-read `kind`.
        struct PayloadSeed(EventKind);

        impl<'de> DeserializeSeed<'de> for PayloadSeed {
            type Value = Event;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Event, D::Error> {
                match self.0 { $( EventKind::$variant => $variant::deserialize(d).map(Event::$variant) ),+ }
            }
        }
    };
}

events! {
    /// Once per discovered `*.test.lua` file, before any dispatching.
    FileDiscovered => "file_discovered" {
        path: String,
        fixture_refs: Vec<String>,
        declared_claim: Option<ResourceAmount>,
    }
    /// A runner thread picked up a file.
    FileDispatched => "file_dispatched" {
        path: String,
        reservation: ResourceAmount,
    }
    /// A file waits on the pool or on PSI pressure.
    FileBlocked => "file_blocked" {
        path: String,
        waiting_for: ResourceAmount,
        /// `pool_full`, `psi_pressure`, …
        reason: String,
    }
    FileCompleted => "file_completed" {
        path: String,
        status: FileStatus,
        duration_ns: u64,
    }
    TestStarted => "test_started" {
        path: String,
        name: String,
        meta: MetaMap,
    }
    TestPassed => "test_passed" {
        path: String,
        name: String,
        duration_ns: u64,
        meta: MetaMap,
    }
    TestFailed => "test_failed" {
        path: String,
        name: String,
        duration_ns: u64,
        reason: String,
        /// Last 4 KiB of each booted VM's console log; may be empty.
        console_excerpt: String,
        meta: MetaMap,
    }
    TestSkipped => "test_skipped" {
        path: String,
        name: String,
        reason: String,
        meta: MetaMap,
    }
    VmSpawned => "vm_spawned" {
        file: String,
        vm_name: String,
        profile: String,
        memory_bytes: u64,
        cid: u32,
    }
    VmShutdown => "vm_shutdown" {
        file: String,
        vm_name: String,
        duration_ns: u64,
    }
    PoolState => "pool_state" {
        used: ResourceAmount,
        available: ResourceAmount,
    }
    ClaimAcquired => "claim_acquired" {
        path: String,
        amount: ResourceAmount,
    }
    ClaimReleased => "claim_released" {
        path: String,
        amount: ResourceAmount,
    }
    FixtureBuildStarted => "fixture_build_started" {
        path: String,
    }
    FixtureBuildDone => "fixture_build_done" {
        path: String,
        duration_ns: u64,
        snapshot_bytes: u64,
    }
    FixtureBuildWaiting => "fixture_build_waiting" {
        path: String,
        held_by_file: String,
    }
    FixtureCacheHit => "fixture_cache_hit" {
        path: String,
    }
    /// Once per run, before `file_discovered`: what `provium report merge`
    /// needs to tell shards apart and to check that they belong together.
    RunStarted => "run_started" {
        /// Unique per invocation (host, pid and start time, hashed).
        run_id: String,
        /// A hash of every file the suite discovered before partitioning:
        /// shards of one suite share it.
        suite_id: String,
        /// How many files the suite discovered before partitioning.
        suite_files: u32,
        /// `count:I/N` or `hash:I/N` for a sharded run, else none.
        partition: Option<String>,
    }
}

const FRAME_FIELDS: &[&str] = &["ts", "kind", "payload"];

impl Serialize for EventFrame {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("EventFrame", 3)?;
        st.serialize_field("ts", &self.ts)?;
        st.serialize_field("kind", &self.event.kind())?;
        st.serialize_field("payload", &PayloadRef(&self.event))?;
        st.end()
    }
}

impl<'de> Deserialize<'de> for EventFrame {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct("EventFrame", FRAME_FIELDS, FrameVisitor)
    }
}

struct FrameVisitor;

impl FrameVisitor {
    /// The envelope's keys come in encoding order (ts, kind, payload), so the
    /// payload can be decoded by kind without buffering it.
    fn expect_key<'de, A: MapAccess<'de>>(map: &mut A, want: &'static str) -> Result<(), A::Error> {
        match map.next_key::<String>()? {
            Some(k) if k == want => Ok(()),
            Some(k) => Err(de::Error::custom(format!(
                "event frame: expected key `{want}`, found `{k}` (keys are ts, kind, payload in that order)"
            ))),
            None => Err(de::Error::custom(format!("event frame: missing key `{want}`"))),
        }
    }
}

impl<'de> Visitor<'de> for FrameVisitor {
    type Value = EventFrame;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event frame map {ts, kind, payload}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EventFrame, A::Error> {
        Self::expect_key(&mut map, "ts")?;
        let ts: i64 = map.next_value()?;
        Self::expect_key(&mut map, "kind")?;
        let kind_name: String = map.next_value()?;
        let kind = EventKind::from_wire(&kind_name).ok_or_else(|| {
            let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
            de::Error::custom(format!(
                "unknown event kind `{kind_name}`; known kinds: {}",
                known.join(", ")
            ))
        })?;
        Self::expect_key(&mut map, "payload")?;
        let event = map.next_value_seed(PayloadSeed(kind))?;
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "event frame: unexpected key `{extra}`"
            )));
        }
        Ok(EventFrame { ts, event })
    }
}

impl WireMessage for EventFrame {
    const WHAT: &'static str = "event frame";
}
