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
        if new.listen != old.listen { keys.append("listen") }
        if new.admin.listen != old.admin.listen { keys.append("admin.listen") }
        if (new.workers ?? cores) != (old.workers ?? cores) { keys.append("workers") }
        if new.limits.maxRequestBody != old.limits.maxRequestBody { keys.append("limits.max_request_body") }
        if new.limits.maxHeaderBytes != old.limits.maxHeaderBytes { keys.append("limits.max_header_bytes") }
        if new.limits.clientTimeout != old.limits.clientTimeout { keys.append("limits.client_timeout") }
        return keys.map { "\($0) cannot change on reload (restart to apply)" }
    }
}
