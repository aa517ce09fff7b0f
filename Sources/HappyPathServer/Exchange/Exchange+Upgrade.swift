import HappyPathCore
import HappyPathIO
import HappyPathPolicies

// MARK: - Upgrade

/// An upgrade request (the route's `upgrades`, docs/websocket.md): its
/// tries are `UpstreamUpgrade`s on their own connections, not libcurl
/// transfers; an upstream's `101` is read field by field, checked, and on
/// success the client's connection becomes a tunnel to the try's.
extension Exchange {
    /// An upgrade try: its own connection, the head written by the proxy.
    func startUpgrade(_ upgrade: UpgradeRequest, endpoint index: Int, limit: Duration) -> UpstreamUpgrade {
        let endpoint = upstream.endpoints[index]
        var credentials: HTTPField?
        if let token = authToken, let tokens { credentials = HTTPField(name: tokens.header, value: token.credential.reveal) }
        let head = upgrade.head(
            target: endpoint.basePath + command.target, origin: endpoint.origin, fields: command.headers.fields,
            replacing: credentials)
        let attempt = UpstreamUpgrade(
            loop: env.loop,
            request: UpstreamUpgradeRequest(
                origin: endpoint.origin, head: head, connectTimeout: min(upstream.connectTimeout, limit),
                idleTimeout: env.idleTimeout, tls: upstream.tls, connectTo: endpoint.connectTo),
            handler: self)
        attempt.start()
        return attempt
    }

    /// The upstream switched: the `101` goes to the client, whose
    /// connection becomes a tunnel to the upgrade's; the exchange ends as
    /// a success.
    func upstreamSwitched(_ connection: UpstreamUpgrade) {
        upgradeTry = nil
        // The tunnel keeps the try's upstream connection open, so it keeps
        // the try's slot of the upstream's max_connections until it closes;
        // on an adaptive upstream among its streams, if `max_streams` has room.
        var slot: HeldSlot?
        let kept = machine.keepSlotForTunnel()
        if kept != .none, let lane {
            slot = HeldSlot(lane: lane, holder: slotHolder, streams: kept == .streams || env.moveToStreams(lane, slotHolder))
        }
        releaseSlot()
        let fields = upgrade?.answerFields(switching ?? [], requestID: command.requestID) ?? []
        switching = nil
        let clock = env.clock
        // Counted open before the 101 leaves: a client that has its 101 and
        // reads /metrics at once finds its tunnel counted.
        env.tunnelsOpen.add(1)
        guard !isFinished, let client = request as? HTTPRequest,
            let tunnel = client.switchProtocols(
                fields: fields, to: connection, limits: .init(idle: route.upgradesIdleTimeout), now: { clock.now() })
        else {
            env.tunnelsOpen.add(-1)
            if let slot { env.giveBack(slot) }
            // The client left as the upstream agreed: the upstream did its part.
            connection.close()
            return perform(machine.clientGone())
        }
        env.tunnelOpened(tunnel, route: route, upstream: upstream, slotOf: slot)
        perform(machine.switchedProtocols())
        tryEnded(.answered(status: 101, retryAfter: nil, withToken: authToken != nil && tokens != nil))
    }

    /// The upstream's `101` began: its fields are gathered, not relayed.
    func switchingStarted() {
        switchingHasInvalidField = false
        switching = []
    }

    /// One field of the upstream's `101`.
    func switchingField(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        guard name.allSatisfy({ HTTPBytes.isToken($0) }), value.allSatisfy({ HTTPBytes.isFieldValue($0) }) else {
            return switchingHasInvalidField = true
        }
        switching?.append(HTTPField(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
    }

    /// The `101`'s head is complete: why it is refused (nil: it switches).
    func switchingRefusal(_ switching: [HTTPField], _ upgrade: UpgradeRequest) -> String? {
        if switchingHasInvalidField { return "the upstream's 101 carries an invalid field" }
        return upgrade.refusal(of: switching)
    }
}
