//! The observability event stream: one [`EventFrame`] per frame,
//! `{"ts": i64, "kind": "<name>", "payload": {…}}` (the event flattened into
//! the envelope), with every variant and field of the reference's Events page.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use crate::meta::MetaMap;
use crate::WireMessage;

/// One frame of the event stream: when, and what happened.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq)]
pub struct EventFrame {
    /// Nanoseconds since the Unix epoch, host clock at emission.
    pub ts: i64,
    /// The event; its kind and payload are the frame's `kind` and `payload`.
    pub event: Event,
}

/// Resources in pool / claim / reservation events.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceAmount {
    /// Guest memory, in bytes.
    pub memory_bytes: u64,
    /// Virtual CPUs.
    pub cpus: u32,
}

closed_enum! {
    /// How a test file ended.
    pub enum FileStatus {
        /// It loaded and every test passed or was skipped.
        Passed => "passed",
        /// A test failed, or the file did not load.
        Failed => "failed",
        /// It ran past `--timeout`.
        TimedOut => "timed_out",
        /// The harness runner for it crashed before it finished.
        Crashed => "crashed",
    }
}

macro_rules! events {
    ( $( $(#[$doc:meta])* $variant:ident => $wire:literal { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? } )+ ) => {
        closed_enum! {
            /// The `kind` of every event.
            pub enum EventKind {
                $(
                    #[doc = concat!("The kind of a [`", stringify!($variant), "`] event.")]
                    $variant => $wire
                ),+
            }
        }

        $(
            $(#[$doc])*
            #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            #[serde(deny_unknown_fields)]
            pub struct $variant { $( $(#[$fdoc])* pub $field: $ty ),* }
        )+

        /// Every event of the stream, one variant per kind, each carrying
        /// its payload struct of the same name.
        #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
        #[derive(Debug, Clone, PartialEq)]
        pub enum Event {
            $(
                #[doc = concat!("A `", $wire, "` event; see [`", stringify!($variant), "`].")]
                $variant($variant)
            ),+
        }

        impl Event {
            /// The frame's `kind`.
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
        /// The file, relative to the test root.
        path: String,
        /// The fixtures it names.
        fixture_refs: Vec<String>,
        /// The resources it declares it needs, if it declares any.
        declared_claim: Option<ResourceAmount>,
    }
    /// A runner thread picked up a file.
    FileDispatched => "file_dispatched" {
        /// The file, relative to the test root.
        path: String,
        /// What the pool set aside for it.
        reservation: ResourceAmount,
    }
    /// A file waits on the pool or on PSI pressure.
    FileBlocked => "file_blocked" {
        /// The file, relative to the test root.
        path: String,
        /// What it needs and the pool cannot give yet.
        waiting_for: ResourceAmount,
        /// `pool_full`, `psi_pressure`, …
        reason: String,
    }
    /// A file finished, whatever the outcome.
    FileCompleted => "file_completed" {
        /// The file, relative to the test root.
        path: String,
        /// How it ended.
        status: FileStatus,
        /// Wall time the file took, in nanoseconds.
        duration_ns: u64,
    }
    /// A test began.
    TestStarted => "test_started" {
        /// Its file, relative to the test root.
        path: String,
        /// The test's name.
        name: String,
        /// The test's metadata, as its file declared it.
        meta: MetaMap,
    }
    /// A test passed.
    TestPassed => "test_passed" {
        /// Its file, relative to the test root.
        path: String,
        /// The test's name.
        name: String,
        /// How long it ran, in nanoseconds.
        duration_ns: u64,
        /// The test's metadata.
        meta: MetaMap,
    }
    /// A test failed.
    TestFailed => "test_failed" {
        /// Its file, relative to the test root.
        path: String,
        /// The test's name.
        name: String,
        /// How long it ran, in nanoseconds.
        duration_ns: u64,
        /// Why it failed: the error the test raised, as text.
        reason: String,
        /// Last 4 KiB of each booted VM's console log; may be empty.
        console_excerpt: String,
        /// The test's metadata.
        meta: MetaMap,
    }
    /// A test was skipped and did not run.
    TestSkipped => "test_skipped" {
        /// Its file, relative to the test root.
        path: String,
        /// The test's name.
        name: String,
        /// Why (the skip's own message, or the filter that left it out).
        reason: String,
        /// The test's metadata.
        meta: MetaMap,
    }
    /// A VM booted (or was restored) for a test file.
    VmSpawned => "vm_spawned" {
        /// The test file, relative to the test root.
        file: String,
        /// The VM's name in the file.
        vm_name: String,
        /// The profile it was built from.
        profile: String,
        /// Its guest memory, in bytes.
        memory_bytes: u64,
        /// Its vsock context id; 0 when it has none (local backend).
        cid: u32,
    }
    /// A VM stopped.
    VmShutdown => "vm_shutdown" {
        /// The test file, relative to the test root.
        file: String,
        /// The VM's name in the file.
        vm_name: String,
        /// How long it was up (from boot or restore), in nanoseconds.
        duration_ns: u64,
    }
    /// The pool's resources after a change.
    PoolState => "pool_state" {
        /// Claimed by running files.
        used: ResourceAmount,
        /// Still free.
        available: ResourceAmount,
    }
    /// A file's claim on the pool was granted.
    ClaimAcquired => "claim_acquired" {
        /// The file, relative to the test root.
        path: String,
        /// What it holds.
        amount: ResourceAmount,
    }
    /// A file gave its claim back.
    ClaimReleased => "claim_released" {
        /// The file, relative to the test root.
        path: String,
        /// What it gave back.
        amount: ResourceAmount,
    }
    /// This run builds a fixture (none was cached).
    FixtureBuildStarted => "fixture_build_started" {
        /// The fixture's name.
        path: String,
    }
    /// A fixture build ended.
    FixtureBuildDone => "fixture_build_done" {
        /// The fixture's name.
        path: String,
        /// How long the build took, in nanoseconds.
        duration_ns: u64,
        /// Size of the cached snapshot, in bytes; 0 when the build failed.
        snapshot_bytes: u64,
    }
    /// Another file (of this run or another) holds the fixture's build
    /// lock; this one waits for its result. Sent once per wait.
    FixtureBuildWaiting => "fixture_build_waiting" {
        /// The fixture's name.
        path: String,
        /// The file that holds the lock.
        held_by_file: String,
    }
    /// A fixture was found in the cache and not rebuilt.
    FixtureCacheHit => "fixture_cache_hit" {
        /// The fixture's name.
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
    /// A running VM was forked (`vm:fork(n)`, or once per VM of a
    /// `lab:fork(n)`): each copy also has its own `vm_spawned`.
    VmForked => "vm_forked" {
        /// The test file, relative to the test root.
        file: String,
        /// The source VM's name in the file (`<sub-lab>/<vm>` below the
        /// forked lab for `lab:fork`).
        source: String,
        /// The copies' names, in copy order (`a.1`, `a.2`, ... for
        /// `vm:fork`; `<lab>.<i>/<vm>` for `lab:fork`).
        copies: Vec<String>,
        /// How long the source was paused for the fork, in nanoseconds.
        source_paused_ns: u64,
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
