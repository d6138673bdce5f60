/**
 * What the extension decides, with no JupyterLab and no browser: the `cells` answer assembled from
 * its chunks, which recorded cell goes into which notebook cell, what a cell already shows, and the
 * words of the notice. The protocol is docs/comm-protocol.md.
 */

import type { IBaseOutput } from '@jupyterlab/nbformat';
import type { JSONObject } from '@lumino/coreutils';

export const PROTOCOL = 1;

/** An output in nbformat's shape (what the cell log renders, and what a cell model holds). */
export type IOutputJSON = IBaseOutput;

/** A recorded cell, as the kernel sends it (one part of it per chunk). */
export interface IRecord {
  cell_id: string | null;
  record_id: number;
  msg_id: string;
  session: number;
  execution_count: number | null;
  status: string;
  running: boolean;
  code: string;
  outputs_truncated: boolean;
  outputs: IOutputJSON[];
}

export interface IRecordPart extends IRecord {
  part: number;
  complete: boolean;
}

/** A recorded cell of this kernel session that the page did not name. */
export interface IUnmatched {
  record_id: number;
  cell_id: string | null;
  execution_count: number | null;
  status: string;
  first_line: string;
}

/** An execute of a notebook cell waiting in the kernel's queue (or starting). */
export interface IQueued {
  cell_id: string;
  msg_id: string;
  code: string;
}

export interface ICellsChunk {
  v: number;
  id: string;
  op: 'cells';
  chunk: number;
  last: boolean;
  cells: IRecordPart[];
  session?: number | null;
  unmatched?: IUnmatched[];
  queued?: IQueued[];
  following?: string[];
}

export interface IAnswer {
  records: IRecord[];
  session: number | null;
  unmatched: IUnmatched[];
  queued: IQueued[];
  following: string[];
}

/** A chunk that does not follow the one before it: the answer cannot be trusted. */
export class ChunkError extends Error {}

/**
 * Gathers one `cells` answer: parts of a cell are joined in order, and the answer is complete when
 * the chunk marked `last` arrives.
 */
export class Assembler {
  private _next = 0;
  private _records = new Map<number, IRecord>();
  private _parts = new Map<number, number>();

  /** Take the next chunk; the whole answer once it is complete, else null. */
  feed(chunk: ICellsChunk): IAnswer | null {
    if (chunk.chunk !== this._next) {
      throw new ChunkError(`chunk ${chunk.chunk} came where ${this._next} was expected`);
    }
    this._next += 1;
    for (const part of chunk.cells) {
      const seen = this._parts.get(part.record_id);
      if ((seen === undefined && part.part !== 0) || (seen !== undefined && part.part !== seen + 1)) {
        throw new ChunkError(`part ${part.part} of record ${part.record_id} is out of order`);
      }
      this._parts.set(part.record_id, part.part);
      const { part: _part, complete: _complete, outputs, ...fields } = part;
      const record = this._records.get(part.record_id);
      if (record === undefined) {
        this._records.set(part.record_id, { ...fields, outputs: [...outputs] });
      } else {
        record.outputs.push(...outputs);
      }
    }
    if (!chunk.last) {
      return null;
    }
    const records = [...this._records.values()];
    for (const record of records) {
      record.outputs = mergeStreams(record.outputs);
    }
    return {
      records,
      session: chunk.session ?? null,
      unmatched: chunk.unmatched ?? [],
      queued: chunk.queued ?? [],
      following: chunk.following ?? []
    };
  }
}

function text(value: unknown): string {
  if (Array.isArray(value)) {
    return value.join('');
  }
  return typeof value === 'string' ? value : value === undefined || value === null ? '' : JSON.stringify(value);
}

/** Adjacent writes to one stream joined, as a notebook shows them. */
export function mergeStreams(outputs: IOutputJSON[]): IOutputJSON[] {
  const merged: IOutputJSON[] = [];
  for (const output of outputs) {
    const last = merged[merged.length - 1];
    if (
      output.output_type === 'stream' &&
      last !== undefined &&
      last.output_type === 'stream' &&
      last.name === output.name
    ) {
      merged[merged.length - 1] = { ...last, text: text(last.text) + text(output.text) };
    } else {
      merged.push(output.output_type === 'stream' ? { ...output, text: text(output.text) } : output);
    }
  }
  return merged;
}

/** What a person sees of an output: its type, its text or data, its error; not its metadata. */
function shown(output: IOutputJSON): unknown {
  switch (output.output_type) {
    case 'stream':
      return ['stream', output.name, text(output.text)];
    case 'error':
      return ['error', output.ename, output.evalue];
    default: {
      const data = (output.data ?? {}) as Record<string, unknown>;
      const keys = Object.keys(data).sort();
      return ['display', keys.map(key => [key, typeof data[key] === 'string' || Array.isArray(data[key]) ? text(data[key]) : JSON.stringify(data[key])])];
    }
  }
}

/** Whether a cell already shows these outputs (so putting them in again would change nothing). */
export function sameOutputs(a: IOutputJSON[], b: IOutputJSON[]): boolean {
  const left = mergeStreams(a).map(shown);
  const right = mergeStreams(b).map(shown);
  return JSON.stringify(left) === JSON.stringify(right);
}

/** A notebook cell as the page has it now. */
export interface IPageCell {
  id: string;
  source: string;
  outputs: IOutputJSON[];
  executionCount: number | null;
  /** msg_id of an execute this page sent for it and still hears from (its own future). */
  liveMsgId: string | null;
}

export interface IPlan {
  /** Cells whose outputs are put back (a running one is then followed). */
  restore: Array<{ cellId: string; record: IRecord }>;
  /** Cells edited since they ran: not overwritten; their outputs are offered. */
  edited: Array<{ cellId: string; record: IRecord }>;
  /** Cells queued in the kernel: shown `[*]`, then followed. */
  queued: Array<{ cellId: string; msgId: string }>;
  /** Followed by the kernel but not by this page (its own future, or edited): to unfollow. */
  unfollow: string[];
  /** Records this page showed already. */
  unchanged: number;
  /** Recorded cells of this session the page has no cell for. */
  unmatched: IUnmatched[];
}

/**
 * Which record goes where. A record of this kernel session is put into its cell unless the page
 * already shows it, hears it itself, or the cell's source changed since it ran; a record of an earlier
 * session only fills a cell that shows nothing.
 */
export function plan(page: IPageCell[], answer: IAnswer, byCode: Map<string, IRecord> = new Map()): IPlan {
  const cells = new Map(page.map(cell => [cell.id, cell]));
  const result: IPlan = { restore: [], edited: [], queued: [], unfollow: [], unchanged: 0, unmatched: [] };
  const following = new Set(answer.following);
  const placed = new Set<number>();
  const pairs: Array<[IPageCell, IRecord]> = [];
  for (const record of answer.records) {
    const cell = record.cell_id !== null ? cells.get(record.cell_id) : undefined;
    if (cell !== undefined) {
      pairs.push([cell, record]);
    }
  }
  for (const [cellId, record] of byCode) {
    const cell = cells.get(cellId);
    if (cell !== undefined) {
      pairs.push([cell, record]);
    }
  }
  for (const [cell, record] of pairs) {
    placed.add(record.record_id);
    const ours = cell.liveMsgId === record.msg_id;
    if (ours) {
      result.unchanged += 1;
    } else if (cell.source !== record.code) {
      result.edited.push({ cellId: cell.id, record });
    } else if (answer.session !== null && record.session !== answer.session && (cell.outputs.length > 0 || cell.executionCount !== null)) {
      result.unchanged += 1;
    } else if (!record.running && cell.executionCount === record.execution_count && sameOutputs(cell.outputs, record.outputs)) {
      result.unchanged += 1;
    } else {
      result.restore.push({ cellId: cell.id, record });
      continue;
    }
    if (record.running && following.has(record.msg_id)) {
      result.unfollow.push(record.msg_id);
    }
  }
  for (const queued of answer.queued) {
    const cell = cells.get(queued.cell_id);
    if (cell === undefined || cell.liveMsgId === queued.msg_id || cell.source !== queued.code) {
      if (following.has(queued.msg_id)) {
        result.unfollow.push(queued.msg_id);
      }
      continue;
    }
    result.queued.push({ cellId: cell.id, msgId: queued.msg_id });
  }
  result.unmatched = answer.unmatched.filter(u => !placed.has(u.record_id));
  return result;
}

/**
 * Records the page has no cell for, matched by their code instead: each to the one cell that has
 * exactly that source and shows nothing (a notebook whose ids changed on load, nbformat 4.4). A
 * source shared by two cells, or by two records, matches nothing.
 */
export function matchByCode(page: IPageCell[], records: IRecord[], taken: Set<string>): Map<string, IRecord> {
  const bySource = new Map<string, IPageCell[]>();
  for (const cell of page) {
    if (!taken.has(cell.id) && cell.source.trim() !== '') {
      bySource.set(cell.source, [...(bySource.get(cell.source) ?? []), cell]);
    }
  }
  const recordsBySource = new Map<string, number>();
  for (const record of records) {
    recordsBySource.set(record.code, (recordsBySource.get(record.code) ?? 0) + 1);
  }
  const matched = new Map<string, IRecord>();
  for (const record of records) {
    const candidates = bySource.get(record.code) ?? [];
    const cell = candidates[0];
    if (
      candidates.length === 1 &&
      recordsBySource.get(record.code) === 1 &&
      cell !== undefined &&
      cell.outputs.length === 0 &&
      cell.executionCount === null
    ) {
      matched.set(cell.id, record);
    }
  }
  return matched;
}

/** What a followed cell's pushed output does to it: an output to add, a clear, or nothing. */
export function pushedOutput(msgType: string, content: JSONObject): IOutputJSON | { clear: boolean } | null {
  switch (msgType) {
    case 'stream':
    case 'display_data':
    case 'execute_result':
    case 'error': {
      const { transient: _transient, ...rest } = content;
      return { output_type: msgType, ...rest };
    }
    case 'clear_output':
      return { clear: Boolean(content.wait) };
    default:
      return null; // update_display_data: the displays of a restored snapshot have no ids
  }
}

function cellsWord(n: number): string {
  return `${n} cell${n === 1 ? '' : 's'}`;
}

/** The notice after a restore, or null when there is nothing to say. */
export function notice(result: IPlan, followed: number): string | null {
  const parts: string[] = [];
  if (result.restore.length > 0) {
    parts.push(`klbr restored the outputs of ${cellsWord(result.restore.length)}` + (followed > 0 ? `; following ${cellsWord(followed)} still running or queued` : '') + '.');
  } else if (followed > 0) {
    parts.push(`klbr is following ${cellsWord(followed)} still running or queued.`);
  }
  if (result.edited.length > 0) {
    parts.push(`${cellsWord(result.edited.length)} changed since ${result.edited.length === 1 ? 'it' : 'they'} ran and ${result.edited.length === 1 ? 'was' : 'were'} left as ${result.edited.length === 1 ? 'it is' : 'they are'}.`);
  }
  if (result.unmatched.length > 0) {
    const shown = result.unmatched.slice(0, 5).map(u => `%klbr replay ${u.record_id}`).join(', ');
    parts.push(`${cellsWord(result.unmatched.length)} ran that this page has no cell for (never saved?): ${shown}${result.unmatched.length > 5 ? ', …' : ''}.`);
  }
  return parts.length > 0 ? parts.join(' ') : null;
}

/** A worker's memory as the kernel samples it (bytes); `limit` is `Supervisor.memory_limit`'s. */
export interface IMemory {
  rss: number;
  peak: number;
  limit: number | null;
}

/** Bytes as `%klbr status` writes them: GiB with one decimal, else MiB. */
export function sizeText(n: number): string {
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : `${Math.round(n / 2 ** 20)} MiB`;
}

/** The status item's words for a worker's memory: now, and its limit when it has one. */
export function memoryText(memory: IMemory): string {
  return memory.limit ? `${sizeText(memory.rss)} of ${sizeText(memory.limit)}` : sizeText(memory.rss);
}
