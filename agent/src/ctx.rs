//! What an op handler runs with: the connection, the namespace and worker
//! the request runs in, and whether it is part of a batch. It lives apart
//! from the dispatcher (`dispatch.rs`) so that the handlers (exec, files,
//! process, tail) depend on this context, not on the code that calls them.

use std::sync::Arc;

use provium_protocol::op::WorkerId;

use crate::conn::Conn;
use crate::namespace::Namespace;

/// Work to do after the answer was sent (a stream that must not start
/// before its op's answer: spawn, tail).
pub type Then = Option<Box<dyn FnOnce() + Send>>;

/// One request's context, borrowed for the length of its handler.
pub struct Ctx<'a> {
    pub conn: &'a Arc<Conn>,
    pub ns: &'a Arc<Namespace>,
    /// The worker running this request (None: the connection's namespace).
    pub worker: Option<WorkerId>,
    /// Inside a batch: exec captures its output instead of streaming.
    pub in_batch: bool,
}

impl<'a> Ctx<'a> {
    /// The same request context for the ops of a batch.
    pub fn for_batch(&self) -> Ctx<'a> {
        Ctx {
            conn: self.conn,
            ns: self.ns,
            worker: self.worker,
            in_batch: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_context_keeps_the_request_and_captures_output() {
        let conn = Conn::for_tests();
        let ns = Namespace::new();
        let ctx = Ctx {
            conn: &conn,
            ns: &ns,
            worker: Some(3),
            in_batch: false,
        };
        let sub = ctx.for_batch();
        assert!(sub.in_batch);
        assert_eq!(sub.worker, Some(3));
        assert!(Arc::ptr_eq(sub.conn, &conn) && Arc::ptr_eq(sub.ns, &ns));
    }
}
