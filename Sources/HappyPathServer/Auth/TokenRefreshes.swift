import HappyPathCore
import HappyPathIO

/// The token refreshes running on one worker (docs/auth.md): at most one
/// per upstream across the process (the `TokenSource` decides who starts
/// it), each owned here until it reports (`ended`) or the worker shuts down.
final class TokenRefreshes {
    /// Alive: the worker owns it (`ProxyWorker.refreshes`) and outlives it.
    unowned let worker: ProxyWorker
    private var running: [ObjectIdentifier: TokenRefresh] = [:]

    init(worker: ProxyWorker) { self.worker = worker }

    /// Starts the single refresh for this upstream on this worker's loop.
    func start(guardian: UpstreamGuard) {
        guard let source = guardian.tokens else { return }
        let refresh = TokenRefresh(worker: worker, guardian: guardian, source: source)
        running[ObjectIdentifier(refresh)] = refresh
        refresh.start()
    }

    func ended(_ refresh: TokenRefresh) { running[ObjectIdentifier(refresh)] = nil }

    /// The worker shuts down: every refresh stops quietly.
    func abandonAll() {
        for refresh in running.values { refresh.abandon() }
        running.removeAll()
    }
}
