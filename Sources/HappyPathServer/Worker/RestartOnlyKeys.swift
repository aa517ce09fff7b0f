import HappyPathConfig

/// The configuration keys a SIGHUP reload cannot apply, because what they
/// configure is built once at start: the client and admin listening
/// sockets, the event-loop threads, and the read limits every client
/// connection's parser was made with. A reload that changes one of them is
/// refused whole, with one message per key, rather than half applied;
/// every other key takes effect on the reload (docs/operations.md).
enum RestartOnlyKeys {
    /// One message per restart-only key that differs, naming it; empty
    /// when the reload may go ahead. `workers` counts as changed only if the
    /// number of loops would differ (`auto` is `cores`).
    static func changes(from old: Configuration, to new: Configuration, cores: Int) -> [String] {
        var keys: [String] = []
        // The sockets, and whether each speaks TLS; certificates, min_version
        // and alpn do change on reload (new connections use them).
        if new.listeners.map(\.address) != old.listeners.map(\.address)
            || new.listeners.map({ $0.tls == nil }) != old.listeners.map({ $0.tls == nil })
        {
            keys.append("listen")
        }
        if new.admin.listen != old.admin.listen { keys.append("admin.listen") }
        // The exporter and its sampling are made once, at start.
        if new.tracing != old.tracing { keys.append("tracing") }
        // The Redis link is opened once, at start, on every worker.
        if new.cluster != old.cluster { keys.append("cluster") }
        if (new.workers ?? cores) != (old.workers ?? cores) { keys.append("workers") }
        if new.limits.maxRequestBody != old.limits.maxRequestBody { keys.append("limits.max_request_body") }
        if new.limits.maxHeaderBytes != old.limits.maxHeaderBytes { keys.append("limits.max_header_bytes") }
        if new.limits.maxHeaders != old.limits.maxHeaders { keys.append("limits.max_headers") }
        // Each listener's HTTP/2 settings are made once, with its server.
        if new.listeners.map({ new.http2(for: $0) }) != old.listeners.map({ old.http2(for: $0) }) { keys.append("http2") }
        if new.limits.clientTimeout != old.limits.clientTimeout { keys.append("limits.client_timeout") }
        if new.limits.connectionBuffer != old.limits.connectionBuffer { keys.append("limits.connection_buffer") }
        // Its default follows the store's file; the directory in use is the one chosen at start.
        if new.storage.spoolDir != old.storage.spoolDir { keys.append("storage.spool_dir") }
        if new.limits.encodedSlashes != old.limits.encodedSlashes { keys.append("limits.encoded_slashes") }
        if new.mergeSlashes != old.mergeSlashes { keys.append("normalize.merge_slashes") }
        if old.keepsAnswers {
            // The store of kept answers is made with its limits when the
            // first route keeps answers, and a reload keeps it.
            if new.limits.staleMaxBytes != old.limits.staleMaxBytes { keys.append("limits.stale_max_bytes") }
            if new.limits.staleMaxEntry != old.limits.staleMaxEntry { keys.append("limits.stale_max_entry") }
        }
        if old.usesStore || new.usesStore {
            // The store is opened once, at start, and only if a route needs it.
            if new.storage.path != old.storage.path { keys.append("storage.path") }
            if new.storage.sync != old.storage.sync { keys.append("storage.sync") }
            if new.storage.url != old.storage.url { keys.append("storage.url") }
            if new.storage.pool != old.storage.pool { keys.append("storage.pool") }
            if new.storage.lease != old.storage.lease { keys.append("storage.lease") }
            if new.storage.required != old.storage.required { keys.append("storage.required") }
            if new.storage.maxBytes != old.storage.maxBytes { keys.append("storage.max_bytes") }
            if new.storage.retention != old.storage.retention { keys.append("storage.retention") }
            if new.storage.statusPath != old.storage.statusPath { keys.append("storage.status_path") }
        }
        var messages = keys.map { "\($0) cannot change on reload (restart to apply)" }
        if new.usesStore, !old.usesStore {
            messages.append(
                "delivery.mode: later needs the store, which opens at start only if a route uses it (restart to apply)")
        }
        return messages
    }
}
