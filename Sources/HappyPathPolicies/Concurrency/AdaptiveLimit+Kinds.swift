/// The parts of `AdaptiveLimit` that tell a slow kind of request from an
/// overloaded upstream (issue 44, docs/overload.md "What a sample is
/// compared with"): each kind of request (a route and a path) keeps its own
/// baseline, and the limit follows an average of recent tries' latencies
/// divided by their own kinds' baselines (each counted as 3 at most). A
/// path that is always slow is at its own baseline (ratio 1); an upstream
/// that slows down as a whole raises every kind's ratio, and the average
/// with them.
extension AdaptiveLimit {
    /// The baselines of up to `capacity` kinds of request, in a table of
    /// fixed size. A kind is found within `probes` places of its hash; a
    /// new kind takes a free place or one whose kind has not been seen for
    /// `idleAfter` samples, else it is not tracked (its tries learn nothing
    /// and do not vote). So a client that invents paths cannot push the
    /// kinds in use out, and a kind it makes up for one request never votes.
    struct KindBaselines: Sendable, Equatable {
        static let capacity = 64
        static let probes = 8
        var entries: [Entry]
        let idleAfter: Int
        let recentSamples: Int

        init(idleAfter: Int, recentSamples: Int) {
            entries = Array(repeating: Entry(), count: Self.capacity)
            self.idleAfter = max(1, idleAfter)
            self.recentSamples = recentSamples
        }

        /// The place of `kind` (made for it if need be), as sample number `now` sees it.
        mutating func entry(for kind: UInt64, at now: Int) -> Int? {
            let start = Int(truncatingIfNeeded: (kind &* 0x9E37_79B9_7F4A_7C15) >> 58)  // 6 bits: 0..<64
            var spare: Int?
            for step in 0..<Self.probes {
                let i = (start &+ step) & (Self.capacity - 1)
                if entries[i].used {
                    if entries[i].key == kind {
                        entries[i].lastUse = now
                        return i
                    }
                    if spare == nil, now &- entries[i].lastUse > idleAfter { spare = i }
                } else if spare == nil || entries[spare!].used {
                    spare = i
                }
            }
            guard let i = spare else { return nil }
            entries[i] = Entry(key: kind, used: true, lastUse: now, recentSamples: recentSamples)
            return i
        }
    }

    /// One kind's latency: its recent latency (the median of its last
    /// `recentSamples` tries) and its baseline, the least recent latency
    /// over the last one to two half windows of `baselineSamples` tries of
    /// its own. While the limit sits near the upstream's capacity the
    /// queue empties now and then, and the recent latency with it; the
    /// minimum follows a slower kind up once a window has passed, and a
    /// faster one down at once.
    struct Entry: Sendable, Equatable {
        var key: UInt64 = 0
        var used = false
        var lastUse = 0
        var count = 0
        var recent = 0.0
        var baseline = 0.0
        var windowMin = Double.infinity
        var previousWindowMin = Double.infinity
        var windowCount = 0
        var latencies: MedianWindow

        init(key: UInt64 = 0, used: Bool = false, lastUse: Int = 0, recentSamples: Int = 1) {
            self.key = key
            self.used = used
            self.lastUse = lastUse
            latencies = MedianWindow(size: used ? recentSamples : 1)
        }

        /// Samples a kind has before it votes: its first sets its
        /// baseline (and says nothing of a queue), its second votes. A
        /// path seen once (made up, or an identifier the caller did not
        /// fold into its kind) never votes.
        static let warmUp = 2
        /// A vote is at most this ratio (a baseline of a few nanoseconds
        /// would otherwise make any later try look a million times slower).
        static let mostRatio = 1_000.0

        /// A try of this kind took `seconds`: its ratio to the kind's
        /// baseline (nil: the kind is too new to vote, or has no baseline).
        /// `movesWindow` false (a saturated limit): the sample may lower
        /// the baseline, never raise it, so its window does not move on.
        mutating func measured(
            _ seconds: Double, recentSamples: Int, baselineSamples: Int, floor: Double = 0, movesWindow: Bool
        ) -> Double? {
            count = count == Int.max ? count : count + 1
            recent = latencies.insert(seconds)
            windowMin = min(windowMin, recent)
            baseline = min(previousWindowMin, windowMin)
            if movesWindow {
                windowCount += 1
                if windowCount >= max(1, baselineSamples / 2) {
                    previousWindowMin = windowMin
                    windowMin = .infinity
                    windowCount = 0
                }
            }
            let base = max(baseline, floor)
            guard count >= Self.warmUp, base > 0 else { return nil }
            return min(Self.mostRatio, max(seconds, floor) / base)
        }
    }

    /// The median of the last `size` values, kept sorted beside the ring
    /// they arrived in: an insertion costs one search and a shift of at
    /// most `size` values (`size` is at most `Configuration.mostRecentSamples`).
    struct MedianWindow: Sendable, Equatable {
        let size: Int
        private var ring: [Double] = []
        private var sorted: [Double] = []
        private var head = 0

        init(size: Int) {
            self.size = max(1, size)
            ring.reserveCapacity(self.size)
            sorted.reserveCapacity(self.size)
        }

        /// `value` joins (the oldest leaves once `size` are kept): the median now.
        mutating func insert(_ value: Double) -> Double {
            if ring.count < size {
                ring.append(value)
            } else {
                let old = ring[head]
                ring[head] = value
                head = head + 1 == size ? 0 : head + 1
                sorted.remove(at: Self.firstIndex(notBelow: old, in: sorted))
            }
            sorted.insert(value, at: Self.firstIndex(notBelow: value, in: sorted))
            let n = sorted.count
            return n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2
        }

        static func firstIndex(notBelow value: Double, in a: [Double]) -> Int {
            var lo = 0, hi = a.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if a[mid] < value { lo = mid + 1 } else { hi = mid }
            }
            return lo
        }
    }
}
