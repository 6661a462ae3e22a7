//! The few futures of one connection (its own and one per call), polled
//! when their waker fired. No runtime fits: h2 only reads and writes, the
//! bytes come and go through the caller, and everything runs on the
//! caller's thread, in its call into the connection.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

use rustc_hash::FxHashMap as HashMap;

use crate::call::Token;
use crate::sync::lock;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Default)]
pub(super) struct Executor {
    tasks: HashMap<Token, Task>,
    /// A task keeps its waker from poll to poll.
    wakers: HashMap<Token, Waker>,
    /// Tasks whose waker fired, each once, in the order they fired.
    ready: Arc<Mutex<VecDeque<Token>>>,
}

impl Executor {
    /// Runs `task` as `id` (replacing any task of that id), from its next
    /// [`Executor::poll_next`].
    pub(super) fn spawn(&mut self, id: Token, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.insert(id, Box::pin(task));
        self.wakers.remove(&id);
        self.wake(id);
    }

    pub(super) fn wake(&self, id: Token) {
        push_once(&self.ready, id);
    }

    /// A waker for `id`, for futures polled outside its task (the
    /// handshake, the PING's answer).
    pub(super) fn waker(&self, id: Token) -> Waker {
        Waker::from(Arc::new(TaskWaker {
            id,
            ready: self.ready.clone(),
        }))
    }

    /// Drops task `id`, and with it whatever it held.
    pub(super) fn remove(&mut self, id: Token) {
        self.tasks.remove(&id);
        self.wakers.remove(&id);
    }

    pub(super) fn clear(&mut self) {
        self.tasks.clear();
        self.wakers.clear();
        lock(&self.ready).clear();
    }

    pub(super) fn contains(&self, id: Token) -> bool {
        self.tasks.contains_key(&id)
    }

    /// Polls the next task whose waker fired: its id and whether it
    /// finished (then it is gone). `None`: no task is ready.
    pub(super) fn poll_next(&mut self) -> Option<(Token, bool)> {
        loop {
            let id = lock(&self.ready).pop_front()?;
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            let ready = &self.ready;
            let waker = self.wakers.entry(id).or_insert_with(|| {
                Waker::from(Arc::new(TaskWaker {
                    id,
                    ready: ready.clone(),
                }))
            });
            let finished = task
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_ready();
            if finished {
                self.remove(id);
            }
            return Some((id, finished));
        }
    }
}

/// Marks a task as ready to poll.
struct TaskWaker {
    id: Token,
    ready: Arc<Mutex<VecDeque<Token>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        push_once(&self.ready, self.id);
    }
}

fn push_once(ready: &Mutex<VecDeque<Token>>, id: Token) {
    let mut ready = lock(ready);
    if !ready.contains(&id) {
        ready.push_back(id);
    }
}
