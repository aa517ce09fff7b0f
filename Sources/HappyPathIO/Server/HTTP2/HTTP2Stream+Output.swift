import HappyPathCore

/// How much of an answer a stream may stage or read ahead now: the
/// connection's shared bound, and the stream's spool (`limits.read_ahead`).
extension HTTP2Stream {
    /// What the connection may still stage, all its streams together (0 or
    /// less: this answer waits). A stream with nothing of its own staged may
    /// always stage one read more: a read its upstream transfer made already
    /// costs the same waiting here as inside libcurl, and so one stalled
    /// stream that filled the connection never holds up another's answer.
    /// A stalled client's connection holds the bound plus one read per stream.
    ///
    /// An answer read ahead has the room its spool has left besides: the
    /// memory's none while the spool holds bytes (they go first).
    public func outputRoom(for request: HTTPRequest) -> Int {
        guard current === request else { return 0 }
        // Spooling: what follows goes to the spool too, within its room alone.
        if spooling { return readAheadRoom }
        let room = stagingBound - session.stagedBytes
        let memory = session.stagedOutput(for: id) == 0 ? max(1, room) : room
        let ahead = readAheadRoom
        return ahead > 0 ? max(0, memory) + ahead : memory
    }

    public func permitReadAhead(for request: HTTPRequest) {
        guard current === request, readAheadLimit > 0 else { return }
        readsAhead = true
    }

    /// A stream waiting for room (`drainWanted`) may go on.
    var mayGoOn: Bool {
        if session.pendingOutput(for: id) == 0 { return true }
        if spooling { return readAheadRoom > 0 }
        return session.stagedBytes <= stagingBound / 2
    }

    /// Bytes the answer may still read ahead into its spool (0: none).
    var readAheadRoom: Int {
        guard readsAhead else { return 0 }
        guard hasSpool else { return readAheadLimit }
        return session.spool(for: id)?.room ?? readAheadLimit
    }

    /// The stream's spool holds bytes (what follows must go there too).
    var spooling: Bool { hasSpool && session.spool(for: id)?.isEmpty == false }

    /// `n` bytes go to the spool: it holds bytes already, or they would
    /// take the connection past its bound while this stream has bytes staged.
    func spills(_ n: Int) -> Bool {
        if spooling { return true }
        return session.stagedBytes + n > stagingBound && session.stagedOutput(for: id) > 0
    }
}
