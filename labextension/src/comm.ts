/**
 * One open `klbr` comm: requests sent with ids of their own, their answers (a `cells` answer assembled
 * from its chunks), the kernel's refusals as `KlbrError`s, and its pushes handed to its holder. Opened
 * and closed by `KernelLink`. No JupyterLab here: the comm is a narrow port (a `Kernel.IComm` is one).
 */

import type { JSONObject } from '@lumino/coreutils';

import { Assembler, IAnswer, PROTOCOL } from './logic';
import {
  IEndedPush,
  IKernelState,
  IOutputPush,
  isCellsChunk,
  isEndedPush,
  isKernelState,
  isOutputPush,
  refusal
} from './messages';

/** A request the kernel refused, or one that could not be asked: `name` is the protocol's error name. */
export class KlbrError extends Error {
  constructor(
    readonly name: string,
    message: string
  ) {
    super(message);
  }
}

/** What a `KlbrComm` needs of the comm it speaks on. */
export interface ICommPort {
  readonly isDisposed: boolean;
  send(data: JSONObject): unknown;
  close(): unknown;
}

/** Who hears what the kernel pushes on the comm. */
export interface IPushHandler {
  state(state: IKernelState): void;
  output(push: IOutputPush): void;
  ended(push: IEndedPush): void;
}

interface IAsked {
  reject: (error: Error) => void;
}

interface IPlainRequest extends IAsked {
  kind: 'plain';
  resolve: (data: JSONObject) => void;
}

interface ICellsRequest extends IAsked {
  kind: 'cells';
  resolve: (answer: IAnswer) => void;
  assembler: Assembler;
  onAnswer?: (answer: IAnswer) => void;
}

type Pending = IPlainRequest | ICellsRequest;

export class KlbrComm {
  constructor(
    private readonly _port: ICommPort,
    private readonly _pushes: IPushHandler
  ) {}

  /** Whether requests can still be sent (neither side has closed it). */
  get isOpen(): boolean {
    return !this._closed && !this._port.isDisposed;
  }

  /** Ask the kernel: one request, its answer's data. */
  request(op: string, fields: JSONObject = {}): Promise<JSONObject> {
    return new Promise<JSONObject>((resolve, reject) => this._send(op, fields, { kind: 'plain', resolve, reject }));
  }

  /**
   * Ask for recorded cells (`cells`): the answer once its last chunk is in. `onAnswer` runs as that chunk
   * is handled, before the kernel's next message (a push for a cell the answer says to follow) is.
   */
  cells(fields: JSONObject, onAnswer?: (answer: IAnswer) => void): Promise<IAnswer> {
    return new Promise<IAnswer>((resolve, reject) =>
      this._send('cells', fields, { kind: 'cells', resolve, reject, assembler: new Assembler(), onAnswer })
    );
  }

  /** A message of the kernel on this comm (the data of a `comm_msg`). */
  receive(data: JSONObject): void {
    if (this._closed) {
      return;
    }
    const id = typeof data.id === 'string' ? data.id : null;
    const pending = id !== null ? this._pending.get(id) : undefined;
    const error = refusal(data);
    if (error !== null) {
      console.warn(`klbr: ${error.name}: ${error.message}`);
      if (pending !== undefined && id !== null) {
        this._pending.delete(id);
        pending.reject(new KlbrError(error.name, error.message));
      }
      return;
    }
    if (this._push(data)) {
      return;
    }
    if (pending === undefined || id === null) {
      return;
    }
    if (pending.kind === 'plain') {
      this._pending.delete(id);
      pending.resolve(data);
      return;
    }
    this._chunk(id, pending, data);
  }

  /** Close it from this side: what is still unanswered fails, and the kernel is told. */
  close(): void {
    this._end('the klbr comm closed');
    if (!this._port.isDisposed) {
      try {
        this._port.close();
      } catch {
        // A kernel connection that is gone cannot send the close; the kernel forgets it anyway.
      }
    }
  }

  /** The kernel closed it (or its connection went): what is still unanswered fails. */
  closedByKernel(): void {
    this._end('the kernel closed the klbr comm');
  }

  private _send(op: string, fields: JSONObject, pending: Pending): void {
    if (!this.isOpen) {
      pending.reject(new KlbrError('NotConnected', 'no klbr comm is open'));
      return;
    }
    const id = `${op}-${++this._counter}`;
    this._pending.set(id, pending);
    this._port.send({ v: PROTOCOL, id, op, ...fields });
  }

  /** A push handed on (true), or not a push (false). A `restart` answer carries the new state. */
  private _push(data: JSONObject): boolean {
    switch (data.op) {
      case 'state':
        return this._hand(data, 'state', isKernelState, state => this._pushes.state(state));
      case 'output':
        return this._hand(data, 'output', isOutputPush, push => this._pushes.output(push));
      case 'ended':
        return this._hand(data, 'ended', isEndedPush, push => this._pushes.ended(push));
      case 'restart':
        if (isKernelState(data)) {
          this._pushes.state(data);
        }
        return false;
      default:
        return false;
    }
  }

  private _hand<T>(data: JSONObject, op: string, valid: (data: unknown) => data is T, to: (push: T) => void): true {
    if (valid(data)) {
      to(data);
    } else {
      console.warn(`klbr: a malformed ${op} push was ignored`);
    }
    return true;
  }

  private _chunk(id: string, pending: ICellsRequest, data: JSONObject): void {
    let answer: IAnswer | null;
    try {
      if (!isCellsChunk(data)) {
        throw new KlbrError('MalformedAnswer', `the answer to ${id} is not a cells chunk`);
      }
      answer = pending.assembler.feed(data);
      if (answer !== null) {
        pending.onAnswer?.(answer);
      }
    } catch (error) {
      this._pending.delete(id);
      pending.reject(error instanceof Error ? error : new Error(String(error)));
      return;
    }
    if (answer !== null) {
      this._pending.delete(id);
      pending.resolve(answer);
    }
  }

  private _end(why: string): void {
    this._closed = true;
    for (const pending of this._pending.values()) {
      pending.reject(new KlbrError('NotConnected', why));
    }
    this._pending.clear();
  }

  private _closed = false;
  private _counter = 0;
  private _pending = new Map<string, Pending>();
}
