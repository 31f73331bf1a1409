package redislock

import "github.com/redis/go-redis/v9"

// Lua scripts. Each runs atomically on one Redis server. They need Redis 5
// or later (effects replication, so that TIME may precede writes) or a
// compatible server.
//
// Keys of a lock named n (prefix p): KEYS[1] = p{n}, the lock (a string for
// a mutex, a sorted set of owners scored by expiry for a semaphore);
// KEYS[2] = p{n}:token, the token counter (never expires); KEYS[3] =
// p{n}:meta, a semaphore's hash of its permits and its owners' tokens.

// luaToken returns the next fencing token of counter key ck: INCR, raised
// to the server's TIME in microseconds when below it. A counter that is gone
// (flush, eviction, restart without persistence) or behind (restore of an
// older snapshot) thus starts again above every token issued before, as
// long as fewer than one token per microsecond was issued and the server's
// clock did not step back.
const luaToken = `
local function nexttoken(ck)
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local n = redis.call('INCR', ck)
  if n < us then
    redis.call('SET', ck, t[1] .. string.format('%06d', tonumber(t[2])))
    n = us
  end
  return n
end
local function nowms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// mutexAcquire: ARGV owner, ttl ms, want token (1/0). Returns {1, token}
// granted (also to a repeat of a request that was granted), {0, pttl}
// busy, {-1, 0} the name is a semaphore.
var mutexAcquire = redis.NewScript(luaToken + `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then return {1, nexttoken(KEYS[2])} end
  return {1, 0}
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then return {-1, 0} end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[3] == '1' then return {1, tonumber(redis.call('GET', KEYS[2]) or '0')} end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
`)

// mutexExtend: ARGV owner, ttl ms. 1 extended, 0 not ours.
var mutexExtend = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

// mutexRelease: ARGV owner, channel (” for none). 1 released, 0 not ours.
var mutexRelease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], '1') end
  return 1
end
return 0
`)

// luaSem has the semaphore helpers: purge drops owners whose expiry (by
// the server's TIME) passed, keepalive makes the keys live at least ttl.
const luaSem = luaToken + `
local function purge(now)
  local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #old > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    for _, o in ipairs(old) do redis.call('HDEL', KEYS[3], 't:' .. o) end
  end
end
local function keepalive(ttl)
  for _, k in ipairs({KEYS[1], KEYS[3]}) do
    if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
  end
end
`

// semAcquire: ARGV owner, ttl ms, permits. Returns {1, token} granted (or
// repeated), {0, ms until the first holder expires} busy, {-1, permits}
// the name has other permits (or is a mutex: {-1, 0}).
var semAcquire = redis.NewScript(luaSem + `
local ty = redis.call('TYPE', KEYS[1])['ok']
if ty ~= 'zset' and ty ~= 'none' then return {-1, 0} end
local now = nowms()
local ttl = tonumber(ARGV[2])
purge(now)
local n = redis.call('ZCARD', KEYS[1])
if n == 0 then redis.call('DEL', KEYS[3]) end
local lim = redis.call('HGET', KEYS[3], 'permits')
if lim and lim ~= ARGV[3] then return {-1, tonumber(lim)} end
local mine = redis.call('HGET', KEYS[3], 't:' .. ARGV[1])
if mine and redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {1, tonumber(mine)} end
if n >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - now}
end
local tok = nexttoken(KEYS[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('HSET', KEYS[3], 'permits', ARGV[3], 't:' .. ARGV[1], string.format('%d', tok))
keepalive(ttl)
return {1, tok}
`)

// semExtend: ARGV owner, ttl ms. 1 extended, 0 not held (an expired entry
// is removed).
var semExtend = redis.NewScript(luaSem + `
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then return 0 end
local now = nowms()
local ttl = tonumber(ARGV[2])
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], 't:' .. ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
keepalive(ttl)
return 1
`)

// semRelease: ARGV owner, channel. 1 released, 0 not held (expired or
// gone).
var semRelease = redis.NewScript(luaSem + `
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then return 0 end
local now = nowms()
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], 't:' .. ARGV[1])
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('DEL', KEYS[3]) end
if not s then return 0 end
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], '1') end
if tonumber(s) <= now then return 0 end
return 1
`)
