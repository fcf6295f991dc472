//! Locks that a panic elsewhere cannot wedge. Every caller keeps its data whole between single
//! updates (one insert, remove or assignment at a time), so a guard dropped by a panicking thread
//! leaves nothing half-written, and the next caller may go on with what is there.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`, poisoned or not.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads `lock`, poisoned or not.
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes `lock`, poisoned or not.
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken() {
        let shared = std::sync::Arc::new((Mutex::new(1), RwLock::new(2)));
        let poisoner = shared.clone();
        let _ = std::thread::spawn(move || {
            let _m = poisoner.0.lock().unwrap();
            let _w = poisoner.1.write().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(shared.0.is_poisoned() && shared.1.is_poisoned());
        *lock(&shared.0) += 1;
        *write(&shared.1) += 1;
        assert_eq!((*lock(&shared.0), *read(&shared.1)), (2, 3));
    }
}
