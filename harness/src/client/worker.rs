//! Workers: agent-side request queues with their own handle namespace.

use provium_protocol::op::{Op, OpKind, WorkerId};
use provium_protocol::result::OpValue;

use super::connection::AgentClient;
use super::error::ClientError;
use super::ops::AgentOps;

/// A worker on a connection. Every [`AgentOps`] method on it runs in the
/// worker (requests carry `worker: Some(id)`), concurrently with other
/// workers. Dropping it closes it in the agent (its handles and processes
/// are cleaned up there).
#[derive(Debug)]
pub struct Worker {
    client: AgentClient,
    id: WorkerId,
    closed: bool,
}

impl AgentClient {
    /// Create a worker on this connection.
    pub fn spawn_worker(&self) -> Result<Worker, ClientError> {
        match self.call_with(None, Op::WorkerSpawn, None)? {
            OpValue::Worker { worker } => Ok(Worker {
                client: self.clone(),
                id: worker,
                closed: false,
            }),
            v => Err(ClientError::unexpected(OpKind::WorkerSpawn, &v)),
        }
    }
}

impl Worker {
    /// The agent's id for this worker.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Wait until the worker's queued requests have finished (within the op timeout).
    pub fn join(&self) -> Result<(), ClientError> {
        self.client
            .call_with(None, Op::WorkerJoin { worker: self.id }, None)
            .map(drop)
    }

    /// Signal every process the worker started.
    pub fn kill(&self, signal: i32) -> Result<(), ClientError> {
        self.client
            .call_with(
                None,
                Op::WorkerKill {
                    worker: self.id,
                    signal,
                },
                None,
            )
            .map(drop)
    }

    /// Close the worker: the agent cleans up its handles and processes.
    pub fn close(mut self) -> Result<(), ClientError> {
        self.closed = true;
        self.client
            .call_with(None, Op::WorkerClose { worker: self.id }, None)
            .map(drop)
    }
}

impl AgentOps for Worker {
    fn client(&self) -> &AgentClient {
        &self.client
    }
    fn worker_id(&self) -> Option<WorkerId> {
        Some(self.id)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.closed {
            self.client
                .send_detached(None, Op::WorkerClose { worker: self.id });
        }
    }
}
