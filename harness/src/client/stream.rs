//! Readers over agent output streams: a tail, or a spawned process's
//! stdout/stderr.
//!
//! Each chunk handed to the caller is acknowledged at once, so the agent may
//! send more; the host never buffers more than the window per stream, and a
//! stream nobody reads stalls at the agent rather than growing here.

use std::time::{Duration, Instant};

use provium_protocol::op::{Op, StreamId, WorkerId};
use provium_protocol::result::ErrorCode;
use provium_protocol::wire::{Channel, StreamEndReason};

use super::connection::{take_chunks, AgentClient, WaitError};
use super::error::ClientError;

/// What the reader reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A tail: closing it stops the agent-side stream.
    Tail { worker: Option<WorkerId> },
    /// A process's output: closing the reader only detaches it; the rest of
    /// the output is still returned by `Process::wait`.
    Process,
}

/// A pull reader over one agent stream.
#[derive(Debug)]
pub struct StreamReader {
    client: AgentClient,
    stream: StreamId,
    channel: Channel,
    source: Source,
    start_offset: Option<u64>,
    closed: bool,
    eof: bool,
}

impl StreamReader {
    pub(crate) fn tail(
        client: AgentClient,
        worker: Option<WorkerId>,
        stream: StreamId,
        offset: u64,
    ) -> Self {
        StreamReader {
            client,
            stream,
            channel: Channel::Data,
            source: Source::Tail { worker },
            start_offset: Some(offset),
            closed: false,
            eof: false,
        }
    }

    pub(crate) fn process(client: AgentClient, stream: StreamId, channel: Channel) -> Self {
        StreamReader {
            client,
            stream,
            channel,
            source: Source::Process,
            start_offset: None,
            closed: false,
            eof: false,
        }
    }

    /// The agent's stream id (the id of the request that opened it).
    pub fn stream_id(&self) -> StreamId {
        self.stream
    }

    /// Which channel this reader reads.
    pub fn channel(&self) -> Channel {
        self.channel
    }

    /// For a tail: the file offset the stream started at.
    pub fn start_offset(&self) -> Option<u64> {
        self.start_offset
    }

    /// Whether the stream is finished and fully consumed (or closed).
    pub fn is_eof(&self) -> bool {
        self.eof || self.closed
    }

    /// The next chunk, waiting at most `timeout`. `Ok(None)` at end of
    /// stream or when nothing arrived in time ([`Self::is_eof`] tells which).
    /// A stream the agent ended with an error returns that error.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, ClientError> {
        if self.is_eof() {
            return Ok(None);
        }
        let deadline = Instant::now().checked_add(timeout);
        let (stream, channel) = (self.stream, self.channel);
        let res = self.client.wait_for(deadline, |st| {
            let taken = take_chunks(st, stream, channel, Some(1));
            (!taken.is_empty()).then_some(taken)
        });
        let taken = match res {
            Ok(t) => t,
            Err(WaitError::TimedOut) => return Ok(None),
            Err(WaitError::Lost(e)) => return Err(e),
        };
        if let Some(chunk) = taken.data.into_iter().next() {
            self.client.ack(stream, channel, taken.bytes);
            return Ok(Some(chunk));
        }
        self.eof = true;
        if self.source != Source::Process {
            self.client.drop_streams(stream, &[channel]);
        }
        match taken.ended {
            Some((StreamEndReason::Error, message)) => Err(ClientError::StreamFailed {
                stream,
                channel: channel.to_string(),
                message: message.unwrap_or_else(|| "no reason given".into()),
            }),
            _ => Ok(None),
        }
    }

    /// Stop reading. For a tail the agent stops the stream (idempotent; a
    /// stream that already ended closes quietly); for process output the
    /// reader detaches and the output stays for `Process::wait`.
    pub fn close(&mut self) -> Result<(), ClientError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let Source::Tail { worker } = self.source else {
            return Ok(());
        };
        if self.eof {
            return Ok(());
        }
        let res = self.client.call_with(
            worker,
            Op::CloseStream {
                stream: self.stream,
            },
            None,
        );
        self.client.discard_streams(self.stream, &[self.channel]);
        match res {
            Ok(_) => Ok(()),
            Err(ClientError::Op { error, .. }) if error.code == ErrorCode::UnknownStream => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        if let Source::Tail { worker } = self.source {
            if !self.closed && !self.eof {
                self.client.send_detached(
                    worker,
                    Op::CloseStream {
                        stream: self.stream,
                    },
                );
                self.client.discard_streams(self.stream, &[self.channel]);
            }
        }
    }
}
