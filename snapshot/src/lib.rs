//! On-disk snapshot format (memory image + device state) and the fixture cache store.
//!
//! Not built yet: the snapshot issue fills this crate in. It exists now so the
//! workspace has its final shape and the dependency-edge test holds.
