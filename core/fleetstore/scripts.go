package fleetstore

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
)

// The fleet's Lua scripts, each the one place its KEYS and ARGV are
// stated. A script is sent by its SHA-1 (EVALSHA), and in full (EVAL,
// which also caches it) when Redis does not know it yet, e.g. after a
// restart (Eval).

// Script is a Lua script and its SHA-1.
type Script struct {
	src string
	sha string
}

func newScript(src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{src: src, sha: hex.EncodeToString(sum[:])}
}

// scriptCmd is the command that runs a script: verb EVALSHA with its
// SHA-1, or EVAL with its source.
func scriptCmd(verb, script string, keys, args []string) []string {
	cmd := make([]string, 0, 3+len(keys)+len(args))
	cmd = append(cmd, verb, script, strconv.Itoa(len(keys)))
	cmd = append(cmd, keys...)
	cmd = append(cmd, args...)
	return cmd
}

// Results of the fenced writes (writeScript, finishScript).
const (
	FenceOK   = "ok"   // written
	FenceLost = "lost" // the lease is another leader's: nothing written
	FenceNone = "none" // there is no lease: nothing written
	FenceGone = "gone" // the lease holds but the stream vanished: nothing appended
)

// claimScript: KEYS lease, done, readers; ARGV holder, fingerprint,
// lease ms, readers ms. Returns {"replay", doneValue, pttl},
// {"conflict"}, {"lead", holder} or {"follow", holder}. A follower counts
// itself in the holder's field of readers (and uncounts itself when it
// stops reading), which tells a leader whose own client left whether
// others still read its answer.
var claimScript = newScript(`
local d = redis.call('GET', KEYS[2])
if d then
  if string.sub(d, 1, #ARGV[2] + 1) ~= ARGV[2] .. '\n' then return {'conflict'} end
  return {'replay', d, redis.call('PTTL', KEYS[2])}
end
if redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], 'NX', 'PX', ARGV[3]) then
  redis.call('DEL', KEYS[3])
  return {'lead', ARGV[1]}
end
local l = redis.call('GET', KEYS[1])
local sp = string.find(l, ' ', 1, true)
if string.sub(l, sp + 1) ~= ARGV[2] then return {'conflict'} end
local holder = string.sub(l, 1, sp - 1)
redis.call('HINCRBY', KEYS[3], holder, 1)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {'follow', holder}
`)

// writeScript is every write of a generation's leader but its end: a
// batch of entries, a renewal of its lease, or both in one call. KEYS
// lease, stream, readers; ARGV lease value, stream ms, sequence number of
// the first entry, holder, lease ms ("" renews nothing), then kind and
// value of each entry.
//
// It writes only while this leader holds the lease, and renews it only
// then (never taken when missing: a leader whose claim timed out and never
// landed cannot tell whether another generation ran beside its race
// meanwhile). Entries create the stream only with the first (the head):
// an append never re-creates a stream that vanished. Returns {"ok",
// followers reading}, {"lost", 0} when the lease is another's, {"none", 0}
// when there is none, {"gone", 0} when the stream vanished (the renewal
// still done).
var writeScript = newScript(`
local l = redis.call('GET', KEYS[1])
if l ~= ARGV[1] then
  if not l then return {'none', 0} end
  return {'lost', 0}
end
if ARGV[5] ~= '' then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
local n = tonumber(ARGV[3])
if #ARGV > 5 and n > 1 and redis.call('EXISTS', KEYS[2]) == 0 then return {'gone', 0} end
for i = 6, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '*', 't', ARGV[i], 'v', ARGV[i + 1], 'n', n)
  n = n + 1
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {'ok', tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '0')}
`)

// finishScript: KEYS lease, stream, done; ARGV lease value, end kind, done
// value ("" for none), ttl ms, stream ms, sequence number of the first
// entry, last data ("" for none), linger ms of an ended stream, of a
// stored answer's, holder. While this leader holds the lease it
// appends the last data and the end (to a stream that still exists),
// stores the answer and releases the lease: the store comes first, so a
// claim finds the lease or the answer, never neither while a complete
// answer exists. An ended stream lingers only for the followers reading
// it (endLinger), a stored answer's only doneLinger (they finish from the
// stored answer), so Redis holds a stored answer once. A leader that lost
// the lease writes nothing. Sent again after a failure, it finds its own
// end (or its stored answer) and says ok.
var finishScript = newScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if #last == 1 and last[1][2][2] == 'e' then return 'ok' end
  local d = redis.call('GET', KEYS[3])
  if d and string.find(d, '\n@' .. ARGV[10] .. '\n', 1, true) then return 'ok' end
  if not redis.call('GET', KEYS[1]) then return 'none' end
  return 'lost'
end
local n = tonumber(ARGV[6])
local res = 'ok'
if n == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  if ARGV[7] ~= '' then
    redis.call('XADD', KEYS[2], '*', 't', 'd', 'v', ARGV[7], 'n', n)
    n = n + 1
  end
  redis.call('XADD', KEYS[2], '*', 't', 'e', 'v', ARGV[2], 'n', n)
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
else
  res = 'gone'
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[9])
end
redis.call('DEL', KEYS[1])
return res
`)

// unstoreScript takes back an answer the store's budgets refused
// (FinishStored): KEYS done, stream; ARGV holder, end linger ms. Only the
// holder's own answer is deleted; its stream then lingers as an unstored
// answer's does (EndLinger), for the followers still reading it.
var unstoreScript = newScript(`
local d = redis.call('GET', KEYS[1])
if d and string.find(d, '\n@' .. ARGV[1] .. '\n', 1, true) then
  redis.call('DEL', KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
`)

// storeBudgetScript admits an answer to the fleet store within the
// route's and the caller's byte budgets (Redis' clock). KEYS route set,
// route total, caller set, caller total; ARGV size, ttl ms, member (the
// identity), route budget, caller budget. Each set holds "<size>:<member>"
// scored by its expiry; expired ones leave the totals first. Returns 1
// when the answer fits both (and counts it); else {0, "route" or
// "caller": the budget that refused, ms until that budget's first stored
// answer expires}: a full store stores nothing new until stored answers
// expire, and its replicas need not ask before then.
var storeBudgetScript = newScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function used(set, total)
  local gone = redis.call('ZRANGEBYSCORE', set, '-inf', now)
  if #gone > 0 then
    local sum = 0
    for _, m in ipairs(gone) do sum = sum + tonumber(string.match(m, '^(%d+):')) end
    redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
    redis.call('DECRBY', total, sum)
  end
  return tonumber(redis.call('GET', total) or '0')
end
local function refused(scope, set)
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  local ms = 1
  if #first == 2 and tonumber(first[2]) - now > 1 then ms = tonumber(first[2]) - now end
  return {0, scope, ms}
end
local size = tonumber(ARGV[1])
if used(KEYS[1], KEYS[2]) + size > tonumber(ARGV[4]) then return refused('route', KEYS[1]) end
if used(KEYS[3], KEYS[4]) + size > tonumber(ARGV[5]) then return refused('caller', KEYS[3]) end
for i = 1, 3, 2 do
  redis.call('ZADD', KEYS[i], now + tonumber(ARGV[2]), ARGV[1] .. ':' .. ARGV[3])
  redis.call('INCRBY', KEYS[i + 1], size)
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
  redis.call('PEXPIRE', KEYS[i + 1], ARGV[2])
end
return 1
`)

// syncScript settles one route. Every key is the route's, under its hash
// tag (fleetRouteTag), so that a Redis Cluster keeps them on one slot; the
// switch of every route is another slot's and the loop reads it with a
// command of its own (fleetReadAllSwitch). KEYS: budget, switch, health,
// health mark, spend (the base: the script appends Redis' hour), tenant
// (the base: the script appends Redis' minute and the tenant). ARGV: ratio
// (negative: no budget), burst, requests reported, tokens wanted, budget
// ms, overload ms (0: not overloaded); then the spend: cap (0: none, only
// counted; -1: no spend work this sync), the replica's hour (-1: none
// yet), tokens spent since the last sync, the part of them no reservation
// paid for, the reservation held, the reservation wanted, spend ms; then
// the tenants: tenant ms (0: no tenant work this sync), the replica's
// minute (-1: none yet), then tenant hash and count pairs.
//
// The hour and the minute are Redis' (TIME), never a replica's: a replica
// whose clock is off still counts into the fleet's hour. What a replica
// reports of another hour or minute than Redis' (its clock rolled late or
// early, or it has not synced yet) is not added; a reservation it held of
// another hour is void. The spend key holds "<reserved> <spent>": spent
// is what the replicas report, reserved what they hold or spent, and a
// sync grants at most cap - reserved: while the key lives the fleet's
// reservations stay within the cap. A key Redis lost (a restart empty,
// FLUSHALL, a failover to a lagging replica) starts the hour over: the
// spend and the reservations it counted are forgotten.
//
// Health is a hash of "cool:<upstream>", "open:<upstream>" and
// "overload", each holding the Redis time (ms) it ends at: one clock for
// every replica. The health mark is a string with the hash's TTL (set
// wherever the hash is written, here and in publishScript): a sync reads
// it with the bucket, the switch and the spend and reads the hash only
// while it exists, so a fleet without health events pays two commands per
// sync, not three.
//
// Returns {grant, level, route switch, {field, ms left, ...}, spend,
// {tenant totals}, minute}: spend is {Redis' hour, ms left in it, tokens
// granted (negative: given back), reserved, spent} or empty when no spend
// work was asked; minute is {Redis' minute, ms left in it} or empty
// without tenants.
var syncScript = newScript(`
local now = 0
local function clock()
  if now == 0 then
    local tm = redis.call('TIME')
    now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  end
  return now
end
local ratio = tonumber(ARGV[1])
local cap = tonumber(ARGV[7])
local grant = 0
local level = -1
local skey = false
local hour = 0
if cap >= 0 then
  hour = math.floor(clock() / 3600000)
  skey = KEYS[5] .. ':' .. string.format('%.0f', hour)
end
-- One read for the bucket, the switch, the health mark and the spend.
local got
if skey then
  got = redis.call('MGET', KEYS[1], KEYS[2], KEYS[4], skey)
else
  got = redis.call('MGET', KEYS[1], KEYS[2], KEYS[4])
end
if ratio >= 0 then
  local burst = tonumber(ARGV[2])
  local held = got[1]
  local t = tonumber(held or ARGV[2])
  t = t + ratio * tonumber(ARGV[3])
  if t > burst then t = burst end
  local want = tonumber(ARGV[4])
  if want > t then want = math.floor(t) end
  if want < 0 then want = 0 end
  grant = want
  t = t - grant
  -- A missing key is a full bucket: a bucket that stays full (no hedge
  -- wanted) is not written again, one command less per sync.
  if t < burst or (held and tonumber(held) < burst) then
    redis.call('SET', KEYS[1], tostring(t), 'PX', ARGV[5])
  end
  level = t
end
local over = tonumber(ARGV[6])
if over > 0 then
  clock()
  local old = tonumber(redis.call('HGET', KEYS[3], 'overload') or '0')
  if now + over > old then redis.call('HSET', KEYS[3], 'overload', string.format('%.0f', now + over)) end
  local ttl = redis.call('PTTL', KEYS[3])
  if ttl < over then redis.call('PEXPIRE', KEYS[3], over); ttl = over end
  redis.call('SET', KEYS[4], '1', 'PX', ttl)
  got[3] = '1'
end
local h = {}
if got[3] then h = redis.call('HGETALL', KEYS[3]) end
local health = {}
if #h > 0 then clock() end
for i = 1, #h, 2 do
  local left = tonumber(h[i + 1]) - now
  if left > 0 then
    health[#health + 1] = h[i]
    health[#health + 1] = string.format('%.0f', left)
  end
end
local spend = {}
if skey then
  local reserved, spent = 0, 0
  if got[4] then
    local r, s = string.match(got[4], '^(%d+) (%d+)$')
    reserved = tonumber(r) or 0
    spent = tonumber(s) or 0
  end
  local add, unpaid, held = 0, 0, 0
  local change = tonumber(ARGV[12])
  if tonumber(ARGV[8]) == hour then
    add = tonumber(ARGV[9])
    unpaid = tonumber(ARGV[10])
    held = tonumber(ARGV[11])
    change = change - held
  end
  spent = spent + add
  reserved = reserved + unpaid
  local g = 0
  if change > 0 then
    g = cap - reserved
    if g > change then g = change end
    if g < 0 then g = 0 end
  elseif change < 0 then
    g = change
  end
  reserved = reserved + g
  if reserved < spent then reserved = spent end
  if g ~= 0 or add > 0 or unpaid > 0 then
    redis.call('SET', skey, string.format('%.0f %.0f', reserved, spent), 'PX', ARGV[13])
  end
  spend = {hour, (hour + 1) * 3600000 - now, g, reserved, spent}
end
local tenants = {}
local minute = {}
if tonumber(ARGV[14]) > 0 then
  local m = math.floor(clock() / 60000)
  local mine = tonumber(ARGV[15]) == m
  local base = KEYS[6] .. ':' .. string.format('%.0f', m) .. ':'
  for i = 16, #ARGV, 2 do
    local n = '0'
    if mine then n = ARGV[i + 1] end
    tenants[#tenants + 1] = redis.call('INCRBY', base .. ARGV[i], n)
    redis.call('PEXPIRE', base .. ARGV[i], ARGV[14])
  end
  minute = {m, (m + 1) * 60000 - now}
end
return {tostring(grant), tostring(level), got[2] or '', health, spend, tenants, minute}
`)

// publishScript records health events. KEYS: health, health mark (set to
// live as long as the hash: syncScript reads the hash only while the mark
// exists); ARGV: field, ms, ...
var publishScript = newScript(`
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local longest = 0
for i = 1, #ARGV, 2 do
  local ms = tonumber(ARGV[i + 1])
  local old = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if now + ms > old then redis.call('HSET', KEYS[1], ARGV[i], string.format('%.0f', now + ms)) end
  if ms > longest then longest = ms end
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < longest then redis.call('PEXPIRE', KEYS[1], longest); ttl = longest end
if ttl > 0 then redis.call('SET', KEYS[2], '1', 'PX', ttl) end
return 1
`)

// heartbeatScript writes a replica's heartbeat and counts the live ones
// (heartbeats within the TTL). KEYS: replica, live set; ARGV: status JSON,
// ttl ms, replica id, "1" on every tenth beat, live set ttl ms. The tenth
// beat drops the members gone (the set's size is bounded by the replicas
// seen in ten intervals) and renews the set's TTL, which outlasts ten
// intervals; a beat that adds a member (a new replica, or a set that
// expired and starts over) renews it too, so the set always has one.
var heartbeatScript = newScript(`
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local since = now - tonumber(ARGV[2])
local added = redis.call('ZADD', KEYS[2], now, ARGV[3])
if ARGV[4] == '1' then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', since) end
if ARGV[4] == '1' or added > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[5]) end
return redis.call('ZCOUNT', KEYS[2], since, '+inf')
`)
