//! Networking: the userspace L2 switch, impairments, pcap capture, TAPs and uplink.
//!
//! Not built yet: the networking issue fills this crate in.
